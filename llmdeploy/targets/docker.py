"""The docker target: a Docker Compose project run by the `docker compose` on this machine.

Render writes docker-compose.yaml (llmdeploy/render/renderer.py); apply, status, logs and down run
Compose (llmdeploy/apply/docker.py). This module owns the recipe's `target: {type: docker}` section
(`llmdeploy.recipe.target_schema.DockerTarget`); with `llm_d_router: true`, render adds llm-d's
router files for the engine Compose publishes (llmdeploy/targets/llm_d_router.py).
"""

from __future__ import annotations

from llmdeploy.errors import Problem, UserError
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import DockerTarget, Recipe
from llmdeploy.recipe.serving_schema import Section
from llmdeploy.render.renderer import render_compose
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

COMPOSE_FILE = "docker-compose.yaml"


def _section(recipe: Recipe) -> DockerTarget:
    assert isinstance(recipe.target, DockerTarget), recipe.target.type
    return recipe.target


class Docker:
    name = "docker"
    display_name = "Docker Compose"
    section: type[Section] = DockerTarget
    in_container = True
    secrets_from: SecretSource = "env"
    kubernetes_backed = False

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        return router_problems(recipe, _section(recipe).llm_d_router)

    def notes(self, recipe: Recipe) -> list[str]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        section = _section(recipe)
        files = {COMPOSE_FILE: render_compose(recipe, section, plan)}
        if section.llm_d_router:
            files.update(local_router_files(recipe))
        return Rendered(files)

    def apply(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> ApplyResult:
        from llmdeploy.apply.docker import apply_docker

        if request.dry_run:
            raise UserError.one(
                "--dry-run is for Kubernetes-backed targets",
                path="target.type",
                value=self.name,
                fix=f"see the Compose file with `llmdeploy render {request.recipe_path} -o DIR`",
            )
        compose = self.render(recipe, plan).files[COMPOSE_FILE]
        code = apply_docker(recipe, request.recipe_path, compose, plan, request.wait, console.echo)
        url = url_from_recipe(recipe)
        if code != 0:
            return ApplyResult(
                self.name, ok=False, url=url, detail="the Compose project is not up and serving"
            )
        detail = "up and smoke-tested" if request.wait else "started (not waited on)"
        return ApplyResult(self.name, ok=True, url=url, detail=detail)

    def diff(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> int:
        raise no_diff(self.name, request)

    def status(self, recipe: Recipe, cluster: Cluster, console: Console) -> int:
        from llmdeploy.apply.docker import status_docker

        return status_docker(recipe, console.out)

    def logs(self, recipe: Recipe, cluster: Cluster, follow: bool, lines: int, console: Console) -> int:
        from llmdeploy.apply.docker import logs_docker

        return logs_docker(recipe, follow, lines, console.out)

    def down(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        from llmdeploy.apply.docker import down_docker

        return down_docker(recipe, console.out)

    def delete(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        return self.down(recipe, request, console)

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        return url_from_recipe(recipe)

    def startup_log(self, recipe: Recipe) -> str | None:
        return None


DOCKER = Docker()
