"""The `Target` protocol: everything llmdeploy knows about one deployment system, behind one interface.

A target is where a rendered recipe runs: a process on this machine (`local`), a Docker Compose
project (`docker`), plain Kubernetes objects (`kubernetes`), or a serving platform a team already
operates (KServe, llm-d, production-stack, KubeAI). Each stage asks the recipe's target
(`get_target(recipe.target.type)`, llmdeploy/targets/registry.py) instead of branching on its name:

- `validate` / `plan` / `render` / `apply`: `llmdeploy.targets.target_problems(recipe, plan)` runs
  the rules every target shares (the memory gate: a plan that does not fit is refused for every
  target; the engine's flag mapping; where secrets come from, by `secrets_from`; local-only fields
  on a target that runs an image, by `in_container`) and then the target's own `problems`;
- `render`: `llmdeploy.targets.render(recipe, plan)` refuses with every problem at once, else calls
  the target's `render`, which returns `Rendered` (files by relative path, and the Kubernetes
  documents in apply order for Kubernetes-backed targets);
- `apply`: `llmdeploy.targets.apply(recipe, request, console)` plans, refuses with the problems,
  then calls the target's `apply`, which returns an `ApplyResult` (never an exit code: the CLI turns
  `ApplyResult.exit_code` into one);
- `diff`, `status`, `logs`, `down`, `delete`: the CLI verbs, each returning the verb's exit code;
- `smoke`: `endpoint_url` says where the running endpoint answers (a platform reads it from its
  object's status), `startup_log` which engine start-up log smoke may read a KV figure from.

## The recipe section a target owns
The recipe layer sits below targets (tests/test_import_graph.py), so a target's section model lives
in the recipe layer and the target names it:
- the section is a frozen pydantic model deriving `llmdeploy.recipe.serving_schema.Section`
  (`extra="forbid"`) with a `type: Literal["<name>"]` field, the discriminator;
- the three first targets keep theirs in `llmdeploy/recipe/target_schema.py`; a new target puts its
  model in its own module `llmdeploy/recipe/target_<name>.py` (e.g. `target_kserve.py`; it may
  reuse `Toleration`, `Probes`, `Autoscaling` and the Kubernetes field types from the recipe layer)
  and adds it to the `Target` union at the bottom of `target_schema.py`;
- the target module sets `section: type[Section] = <that class>` and `name = "<name>"`;
  tests/targets/test_registry.py checks that every union member has exactly one registered target
  whose `name` equals its `type` literal, and that `llmdeploy schema` lists it
  (regenerate schema/recipe.schema.json with `llmdeploy schema -o schema/recipe.schema.json`).
Nothing outside the target's own module reads its section's fields (the shared rules only read
the facts below), so `isinstance(recipe.target, XTarget)` appears only in `llmdeploy/targets/x.py`.

## Rules (`problems`)
`problems(recipe, plan)` lists what this target cannot express, every problem at once, each a
`Problem` naming the field path to change (`path="target.autoscaling"`, `"engine.type"`,
`"parallelism.pipeline"`, `"speculative"`, ...) and a `fix`; the CLI adds the file:line that wrote
the field. A target never drops a knob silently: an engine it cannot run, pipeline parallelism,
speculative decoding, a probe budget it cannot set, multi-node replicas, autoscaling it cannot
express. Suggest SGLang or vLLM where another engine would work. `plan` may be None (rendering
without a plan); a target then renders without plan figures. `problems` does no I/O.

## Render (`render`)
`render(recipe, plan) -> Rendered` is deterministic: identical input gives byte-identical files (no
timestamps, keys in a fixed order; tests/targets/test_byte_identical.py renders every shipped
recipe for every target twice). Every file starts with `llmdeploy.render.artifacts.header(recipe)`.
Engine argv / env come from `llmdeploy.render.engine_command.engine_command` (the engine's own flag
mapping and catalogue check), never from a target's own flag list. Derive probe budgets and
/dev/shm from the plan (`llmdeploy.render.kubernetes_objects.pod_shape`) wherever the platform lets
them be set. Leave out fields a controller or autoscaler owns (replicas under an autoscaler,
`status`, defaulted fields the server fills in) so a GitOps tool sees no drift. A Kubernetes-backed
target puts the plan's capacity on its serving / workload objects with `capacity_annotations(plan)`
(llmdeploy/render/capacity_marks.py: `llmdeploy.io/kv-cache-tokens`, `llmdeploy.io/max-concurrency`,
`llmdeploy.io/max-model-len`; a Compose file as service labels, a script as `capacity_comment`).
The documents are the objects as the API server will read them (parse the files you render, e.g.
with `llmdeploy.render.renderer.parse_documents`), in apply order.

## Kubernetes-backed targets
A target whose render yields Kubernetes objects derives `KubernetesBackedTarget`
(llmdeploy/targets/kube_backed.py) and inherits apply (server-side apply, field manager `llmdeploy`,
ordered by kind, pruned, waited on), diff, status, logs, down and delete from the kubernetes
target's machinery. It provides only:
- `render` (its objects) and `problems`;
- `namespace(recipe)`: the namespace its objects go to;
- `readiness: Mapping[str, StateOf]`: kind -> a function of the live object returning
  `llmdeploy.apply.rollout.RolloutState` (done / failed / summary / conditions); apply waits on
  these kinds, status reports them, and a cluster that does not serve one of them (the platform's
  CRDs not installed) is an error with a fix;
- `url_from_objects(recipe, live)`: the endpoint URL read from the live objects (e.g. a status
  field the platform's controller sets), None when not known yet; `reads_url_from_cluster = True`
  makes `endpoint_url` connect and call it;
- `owned_kinds: Mapping[str, str]`: kind -> apiVersion of the kinds it renders beyond Kubernetes'
  own (its CRDs), so prune, delete and status find them;
- optionally `pod_selector(recipe)`: the label selector of the engine pods (`logs`), when the
  platform's controller does not copy llmdeploy's instance label onto them.
Its objects may reuse the kubernetes target's pieces (`llmdeploy.render.kubernetes_objects`:
`engine_container`, `pod_spec`, `pod_shape`, `labels`; `render_kubernetes` for a whole Deployment).
A worked example of the contract, against the real API server with its own CRD kind, readiness and
status URL: tests/cluster/test_kube_backed_target.py. Golden renders of every shipped recipe on
every target: tests/render/test_golden_targets.py (`pytest tests/render --update-golden` writes a
new target's).

## Apply, and the verbs
`apply(recipe, plan, request, console) -> ApplyResult`: bring the deployment to the rendered state,
print progress through `console.echo` (stderr), ask through `console.confirm`, and return what
happened. `request.dry_run` on a target that cannot rehearse raises `UserError` naming `--dry-run`.
User mistakes (and a cluster refusing) raise `UserError`; an apply that ran but did not come up
(a failed smoke, a declined prompt) is `ApplyResult(ok=False, ...)`.
`diff` (Kubernetes-backed targets; others raise `UserError` with a fix) prints the changes and
returns 1 when there are any; `status` returns 0 up, 1 not up, 3 not applied here; `logs`, `down`
and `delete` return 0 on success.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from llmdeploy.errors import Problem, UserError
    from llmdeploy.planner import MemoryPlan
    from llmdeploy.recipe.schema import Recipe
    from llmdeploy.recipe.serving_schema import Section


@dataclass(frozen=True)
class Rendered:
    """A target's render: files by relative path (in the order they are written) and, for a
    Kubernetes-backed target, the objects in apply order."""

    files: dict[str, str]
    documents: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Cluster:
    """How to reach a Kubernetes cluster: a kubeconfig file and context (None: the usual defaults:
    $KUBECONFIG merged, else ~/.kube/config, else the pod's service account)."""

    kubeconfig: Path | None = None
    context: str | None = None


@dataclass(frozen=True)
class ApplyRequest:
    """What the caller of `apply` / `down` / `delete` asked for; a target reads what applies to it."""

    recipe_path: Path
    assume_yes: bool = False
    dry_run: bool = False
    force_conflicts: bool = False
    prune: bool = True
    wait: bool = True
    timeout_s: float = 600.0
    cluster: Cluster = field(default_factory=Cluster)


def _stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def _stdout(message: str) -> None:
    print(message, flush=True)


def _refuse(question: str) -> bool:
    return False


@dataclass(frozen=True)
class Console:
    """Where a target speaks: `echo` progress (stderr), `out` results (stdout), `confirm` a question
    (True: go ahead). The library's default asks nobody and declines."""

    echo: Callable[[str], None] = _stderr
    out: Callable[[str], None] = _stdout
    confirm: Callable[[str], bool] = _refuse


@dataclass(frozen=True)
class ApplyResult:
    """What an apply did. `ok`: the deployment is in the rendered state (and, where the target
    smoke-tests or waits, answered); `url`: where it answers, when known; `detail`: one line."""

    target: str
    ok: bool
    url: str | None = None
    detail: str = ""

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1


def no_diff(target: str, request: ApplyRequest) -> UserError:
    """The refusal of `diff` on a target without Kubernetes objects."""
    from llmdeploy.errors import UserError

    return UserError.one(
        f"`llmdeploy diff` compares Kubernetes objects; the {target} target has none",
        path="target.type",
        value=target,
        fix=f"see what would run with `llmdeploy render {request.recipe_path} -o DIR`",
    )


# where a recipe's secrets (server.api_key, server.hf_token) may come from on a target
SecretSource = Literal["env", "secret"]


class Target(Protocol):
    """One deployment system. Attributes are facts; `problems` and `render` do no I/O."""

    # the recipe's `target.type` value
    name: str
    # how messages name it: "Kubernetes", "Docker Compose", "KServe"
    display_name: str
    # the recipe section model it owns (its `type` literal equals `name`)
    section: type[Section]
    # True when the engine runs from a container image (host 0.0.0.0, the model in the image's
    # cache folder, `engine.executable` refused)
    in_container: bool
    # "env": secrets are read from this machine's environment; "secret": from a Kubernetes Secret
    secrets_from: SecretSource
    # True when `render` yields Kubernetes objects and `diff` works
    kubernetes_backed: bool

    def problems(self, recipe: Recipe, plan: MemoryPlan | None) -> list[Problem]:
        """What this target cannot express of `recipe`, every problem at once, each with path and fix."""
        ...

    def notes(self, recipe: Recipe) -> list[str]:
        """What the rendered deployment needs around it beyond this target itself (a storage class,
        a metrics adapter, a controller), one sentence each; `validate` and `plan` print them."""
        ...

    def render(self, recipe: Recipe, plan: MemoryPlan | None) -> Rendered:
        """The files (and Kubernetes documents) for `recipe`; byte-identical for identical input."""
        ...

    def apply(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> ApplyResult:
        """Bring the deployment to the rendered state (the shared problems are checked already)."""
        ...

    def diff(self, recipe: Recipe, plan: MemoryPlan, request: ApplyRequest, console: Console) -> int:
        """Print what `apply` would change; 0 nothing, 1 something (Kubernetes-backed targets)."""
        ...

    def status(self, recipe: Recipe, cluster: Cluster, console: Console) -> int:
        """Print whether the deployment is up: 0 up, 1 not up, 3 not applied here."""
        ...

    def logs(self, recipe: Recipe, cluster: Cluster, follow: bool, lines: int, console: Console) -> int:
        """Print the engine's log (the last `lines`, all when 0), following it when asked."""
        ...

    def down(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        """Stop the deployment (a Kubernetes-backed target deletes its objects, as `delete`)."""
        ...

    def delete(self, recipe: Recipe, request: ApplyRequest, console: Console) -> int:
        """Remove everything the deployment made that llmdeploy owns."""
        ...

    def endpoint_url(self, recipe: Recipe, cluster: Cluster) -> str:
        """The base URL smoke and bench send requests to."""
        ...

    def startup_log(self, recipe: Recipe) -> str | None:
        """The engine's start-up log on this machine, when the target keeps one (None: not here)."""
        ...
