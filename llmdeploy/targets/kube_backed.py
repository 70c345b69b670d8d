"""`KubernetesBackedTarget`: the verbs every target that renders Kubernetes objects shares.

apply is server-side apply with field manager `llmdeploy`, ordered by kind, with a diff from a
server-side dry run first, prune of this recipe's leftovers and a wait on the workload kinds in
`readiness`; diff, status, logs, down and delete work on the same objects (llmdeploy/apply/kube_*.py).
A subclass (the kubernetes target, each platform) provides `render`, `problems`, `namespace`,
`readiness` and, where the platform publishes it, `url_from_objects`; see llmdeploy/targets/base.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from llmdeploy.apply.capacity import capacity_from_plan
from llmdeploy.apply.kube_objects import INSTANCE_LABEL, Instance
from llmdeploy.apply.rollout import STATE_OF_KIND, StateOf
from llmdeploy.errors import Problem
from llmdeploy.planner import MemoryPlan
from llmdeploy.recipe.schema import Recipe
from llmdeploy.smoke.runner import url_from_recipe
from llmdeploy.targets.base import ApplyRequest, ApplyResult, Cluster, Console, Rendered, SecretSource

if TYPE_CHECKING:
    from llmdeploy.recipe.serving_schema import Section


class KubernetesBackedTarget:
    """The verbs of a Kubernetes-backed target; subclasses set the facts and the abstract methods."""

    name: str
    display_name: str
    section: type[Section]
    in_container = True
    secrets_from: SecretSource = "secret"
    kubernetes_backed = True
    # kind -> how its live object says it is ready; apply waits on these, status reports them
    readiness: Mapping[str, StateOf] = STATE_OF_KIND
    # kind -> apiVersion of the kinds it renders beyond Kubernetes' own (a platform's CRDs), so
    # prune, delete and status find them; ordered after the built-in kinds on apply
    owned_kinds: Mapping[str, str] = {}
    # True when `endpoint_url` reads the URL from the live objects (`url_from_objects`)
    reads_url_from_cluster = False

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        raise NotImplementedError

    def notes(self, recipe: Recipe) -> list[str]:
        return []

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        raise NotImplementedError

    def namespace(self, recipe: Recipe) -> str:
        """The namespace the recipe's objects go to."""
        raise NotImplementedError

    def url_from_objects(self, recipe: Recipe, live: Sequence[dict[str, Any]]) -> str | None:
        """The endpoint URL as the live objects state it (None: not stated yet)."""
        return None

    def pod_selector(self, recipe: Recipe) -> str:
        """The label selector of the engine pods (`logs`)."""
        return f"{INSTANCE_LABEL}={recipe.name}"

    def instance(self, recipe: Recipe) -> Instance:
        return Instance(recipe.name, self.namespace(recipe))

    # the verbs

    def apply(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> ApplyResult:
        from llmdeploy.apply.kube_target import ApplyOptions, apply_kubernetes, connect

        objects = [dict(o) for o in self.render(recipe, plan).documents]
        options = ApplyOptions(
            dry_run=request.dry_run,
            force_conflicts=request.force_conflicts,
            prune=request.prune,
            wait=request.wait,
            timeout_s=request.timeout_s,
        )
        with connect(request.cluster.kubeconfig, request.cluster.context) as client:
            code = apply_kubernetes(
                client,
                self.instance(recipe),
                objects,
                capacity_from_plan(recipe, plan),
                options,
                console.confirm,
                console.echo,
                self.readiness,
                self.owned_kinds,
            )
        if code != 0:
            return ApplyResult(self.name, ok=False, detail="nothing applied")
        if request.dry_run:
            return ApplyResult(self.name, ok=True, detail="dry run (server side): nothing was changed")
        url = self.endpoint_url(recipe, request.cluster) if request.wait else None
        waited = "applied and available" if request.wait else "applied (not waited on)"
        return ApplyResult(self.name, ok=True, url=url, detail=waited)

    def diff(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> int:
        from llmdeploy.apply.kube_target import connect, diff_kubernetes

        objects = [dict(o) for o in self.render(recipe, plan).documents]
        with connect(request.cluster.kubeconfig, request.cluster.context) as client:
            return diff_kubernetes(
                client,
                self.instance(recipe),
                objects,
                capacity_from_plan(recipe, plan),
                console.out,
                prune=request.prune,
                readiness=self.readiness,
                extra_kinds=self.owned_kinds,
            )

    def status(self, recipe: Recipe, cluster: Cluster, console: Console) -> int:
        from llmdeploy.apply.kube_target import connect, status_kubernetes

        with connect(cluster.kubeconfig, cluster.context) as client:
            return status_kubernetes(
                client, self.instance(recipe), console.out, self.readiness, self.owned_kinds
            )

    def logs(self, recipe: Recipe, cluster: Cluster, follow: bool, lines: int, console: Console) -> int:
        from llmdeploy.apply.kube_target import connect, logs_kubernetes

        with connect(cluster.kubeconfig, cluster.context) as client:
            return logs_kubernetes(
                client, self.instance(recipe), follow, lines, console.out, self.pod_selector(recipe)
            )

    def delete(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        from llmdeploy.apply.kube_target import connect, delete_kubernetes

        with connect(request.cluster.kubeconfig, request.cluster.context) as client:
            return delete_kubernetes(
                client,
                self.instance(recipe),
                console.confirm,
                console.echo,
                dry_run=request.dry_run,
                extra_kinds=self.owned_kinds,
            )

    def down(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        return self.delete(recipe, request, console)

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        """The platform's URL from its live objects where it publishes one; else the recipe's
        server address (reached through `kubectl port-forward` to the Service)."""
        if self.reads_url_from_cluster:
            from llmdeploy.apply.discovery import Discovery
            from llmdeploy.apply.kube_target import connect
            from llmdeploy.apply.prune import live_objects

            with connect(cluster.kubeconfig, cluster.context) as client:
                found = live_objects(client, Discovery(client), self.instance(recipe), self.owned_kinds)
                live = [o.body for o in found]
                url = self.url_from_objects(recipe, live)
            if url is not None:
                return url
        return url_from_recipe(recipe)

    def startup_log(self, recipe: Recipe) -> str | None:
        return None
