"""The local target: the engine as a background process on this machine.

Render writes launch.sh and engine.env (llmdeploy/render/renderer.py); apply, status, logs and down
are llmdeploy/apply/local.py (state in llmdeploy/apply/local_state.py). This module owns the
recipe's `target: {type: local}` section (`llmdeploy.recipe.target_schema.LocalTarget`); with
`llm_d_router: true`, render adds llm-d's router files for the engine (llmdeploy/targets/llm_d_router.py).
"""

from __future__ import annotations

from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import LocalTarget, Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.render.renderer import render_local_files
from llmdeploy.smoke.runner import url_from_recipe
from llmdeploy.targets.base import (
    ApplyRequest,
    ApplyResult,
    Cluster,
    Console,
    Rendered,
    SecretSource,
    no_diff,
)
from llmdeploy.targets.llm_d_router import local_router_files, router_problems


def _section(recipe: Recipe) -> LocalTarget:
    assert isinstance(recipe.target, LocalTarget), recipe.target.type
    return recipe.target


class Local:
    name = "local"
    display_name = "a local process"
    section: type[Section] = LocalTarget
    in_container = False
    secrets_from: SecretSource = "env"
    kubernetes_backed = False

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        return router_problems(recipe, _section(recipe).llm_d_router)

    def notes(self, recipe: Recipe) -> list[str]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        files = render_local_files(recipe, plan)
        if _section(recipe).llm_d_router:
            files = {**files, **local_router_files(recipe)}
        return Rendered(files)

    def apply(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> ApplyResult:
        from llmdeploy.apply.local import apply_local
        from llmdeploy.apply.local_state import read_state

        if request.dry_run:
            raise UserError.one(
                "--dry-run is for Kubernetes-backed targets; a local apply cannot be rehearsed",
                path="target.type",
                value=self.name,
                fix=f"see what would run with `llmdeploy render {request.recipe_path} -o DIR` or "
                f"`llmdeploy plan {request.recipe_path}`",
            )
        code = apply_local(recipe, request.recipe_path, request.assume_yes)
        state = read_state(recipe)
        url = state.url if state is not None and state.process_alive() else None
        if code != 0:
            return ApplyResult(self.name, ok=False, url=url, detail="the engine is not up and serving")
        return ApplyResult(self.name, ok=True, url=url, detail="running and smoke-tested")

    def diff(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> int:
        raise no_diff(self.name, request)

    def status(self, recipe: Recipe, cluster: Cluster, console: Console) -> int:
        from llmdeploy.apply.local import status_local

        return status_local(recipe)

    def logs(self, recipe: Recipe, cluster: Cluster, follow: bool, lines: int, console: Console) -> int:
        from llmdeploy.apply.local import logs_local

        return logs_local(recipe, follow, lines)

    def down(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        from llmdeploy.apply.local import down_local

        return down_local(recipe)

    def delete(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        return self.down(recipe, request, console)

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        return url_from_recipe(recipe)

    def startup_log(self, recipe: Recipe) -> str | None:
        from llmdeploy.apply.local_state import read_state

        # a locally applied recipe keeps its engine's start-up log: a KV figure for engines whose
        # /metrics state none
        state = read_state(recipe)
        return state.log_path if state is not None else None


LOCAL = Local()
