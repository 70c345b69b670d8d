"""The targets llmdeploy deploys to, by the name a recipe's `target.type` gives."""

from __future__ import annotations

from llmdeploy.errors import UserError
from llmdeploy.targets.base import Target
from llmdeploy.targets.docker import DOCKER
from llmdeploy.targets.kserve import KSERVE
from llmdeploy.targets.kubeai import KUBEAI
from llmdeploy.targets.kubernetes import KUBERNETES
from llmdeploy.targets.llm_d import LLM_D
from llmdeploy.targets.local import LOCAL
from llmdeploy.targets.production_stack import PRODUCTION_STACK

# the order messages and the docs list them in
TARGETS: dict[str, Target] = {
    target.name: target for target in (LOCAL, DOCKER, KUBERNETES, KSERVE, LLM_D, PRODUCTION_STACK, KUBEAI)
}


def get_target(name: str) -> Target:
    """The target named `name` (a recipe's target.type)."""
    target = TARGETS.get(name)
    if target is None:
        raise UserError.one(
            f"no target named {name!r}",
            path="target.type",
            value=name,
            fix=f"use one of: {', '.join(TARGETS)}",
        )
    return target
