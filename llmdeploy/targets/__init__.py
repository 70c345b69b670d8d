"""Where a recipe deploys: one `Target` per deployment system (llmdeploy/targets/base.py).

`render` and `apply` are the stages that go through the recipe's target; `get_target` finds a target
by the recipe's `target.type`; `target_problems` is every check they make (the memory gate first).
"""

from llmdeploy.targets.base import ApplyRequest, ApplyResult, Cluster, Console, Rendered, Target
from llmdeploy.targets.registry import TARGETS, get_target
from llmdeploy.targets.rules import fit_problems, target_problems, target_rule_problems
from llmdeploy.targets.stage import apply, checked_plan, render

__all__ = [
    "TARGETS",
    "ApplyRequest",
    "ApplyResult",
    "Cluster",
    "Console",
    "Rendered",
    "Target",
    "apply",
    "checked_plan",
    "fit_problems",
    "get_target",
    "render",
    "target_problems",
    "target_rule_problems",
]
