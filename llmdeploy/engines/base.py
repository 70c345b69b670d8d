"""The `Engine` protocol: everything llmdeploy knows about one serving engine, behind one interface.

Each stage asks the recipe's engine (`get_engine(recipe.engine.type)`) instead of branching on its
name:

- `validate` (recipe rules): `support_problems`, `gpu_problems`, `length_problems`,
  `speculative_problems` and `notes` say what the engine cannot honour, every problem at once;
- `plan`: `memory_plan` is the engine's own start-up accounting, built from `llmdeploy.memory`;
- `render`: `map_flags` turns the recipe into argv / environment on a `Flags` collector, which the
  engine's flag catalogue (`catalogue_file`, loaded by `llmdeploy.engines.catalogue`) then checks;
  `entrypoint`, `api_key_env`, `image` / `container_image` and the metric names fill the launch files;
- `apply` (local): `executable`, `install_hint` and `local_python` find the install on this machine;
- `smoke`: `kv_capacity_from_metrics` and `kv_log_line` read the KV cache size it really allocated.

A new engine is one module implementing this protocol plus its catalogue file under
`llmdeploy/engines/catalogues/`, registered in `llmdeploy/engines/registry.py`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from llmdeploy.catalog.gpus import GPUSpec
    from llmdeploy.catalog.model_spec import ModelSpec
    from llmdeploy.engines.flags import Flags
    from llmdeploy.errors import Problem
    from llmdeploy.memory.memory_plan import MemoryPlan
    from llmdeploy.memory.plan_inputs import PlanInputs
    from llmdeploy.recipe.schema import Recipe


# one sample of a Prometheus text exposition: (name, labels, value)
MetricSample = tuple[str, dict[str, str], float]


@dataclass(frozen=True)
class KVCapacity:
    """The engine's KV cache size in tokens, and where the number was read."""

    tokens: int
    source: str  # e.g. "/metrics llmdeploy:kv_cache_tokens"


@dataclass(frozen=True)
class PlanFigures:
    """The memory plan's figures a flag mapping may place (None: rendered without a plan)."""

    kv_cache_tokens: int | None = None


@dataclass(frozen=True)
class LocalPython:
    """How a Python engine's install is recognised: the module it imports and the distributions
    whose version names the release."""

    module: str
    distributions: tuple[str, ...]


class Engine(Protocol):
    """One serving engine. Attributes are facts; methods derive values and never do I/O."""

    # the recipe's `engine.type` value
    name: str
    # how messages name it: "vLLM", "TGI", "the built-in engine"
    display_name: str
    # the release rendered when `engine.version` is unset; a flag catalogue exists for it
    pinned_version: str
    # argv before the flags, as rendered (the local target swaps in the install found)
    entrypoint: tuple[str, ...]
    # the variable the engine reads its API key from
    api_key_env: str
    # the flag that carries the model argument ("--model", "--model-id")
    model_flag: str
    # the flag that carries the listen address ("--host", "--hostname")
    host_flag: str
    # the container image rendered when the target names none
    image: str
    # Prometheus metric names: waiting requests, KV cache usage (None: it exports none)
    queue_metric: str | None
    kv_usage_metric: str | None
    # True when its /metrics speak another engine's names besides its own, so its own gauge
    # is read first by smoke (the built-in engine exports vLLM's names)
    reexports_metrics: bool
    # the start-up log line stating its KV cache size; group 1 is the token count (None: none)
    kv_log_line: re.Pattern[str] | None
    # the program on PATH that starts it, and what to install when it is missing
    executable: str
    install_hint: str
    # set for engines started through a Python interpreter (None: a native program)
    local_python: LocalPython | None
    # how `apply` asks the install found whether it takes the rendered flags: "python-parser"
    # (its argparse parser, apply/vllm_parser_check.py), "help-text" (the flags its --help
    # lists), or None (its catalogue is generated from the parser that ships here)
    local_flag_check: str | None
    # True for the engine that ships inside llmdeploy (`llmdeploy serve` runs it; found without PATH)
    bundled: bool
    # True when a started engine echoes llmdeploy's instance id, so a stranger on the port is told apart
    echoes_instance_id: bool
    # False when the engine never downloads from a model hub (a hub token is refused)
    downloads_from_hub: bool
    # environment set locally when the model is a folder on this machine (no hub wait): (name, value)
    local_folder_env: tuple[tuple[str, str], ...]
    # True when it reads a GGUF file only as a checkpoint folder `apply` converts it into
    gguf_as_checkpoint: bool
    # the model argument for random weights: prefix + model id (None: the id, with its own flag)
    random_weights_prefix: str | None
    # the variable a rendered launch.sh reads the interpreter from (None: the entry point as rendered)
    launch_python_var: str | None
    # seconds it drains in-flight requests after SIGTERM (None: not known); a pod's grace period covers it
    drain_timeout_s: int | None
    # True when it always serves TGI's /generate API, which smoke then checks
    tgi_api: bool
    # False when its API has no ignore_eos (bench then does not send it unless asked)
    accepts_ignore_eos: bool
    # True when its plan reads a given static-pool fraction (SGLang's --mem-fraction-static)
    takes_mem_fraction_static: bool

    def catalogue_file(self, version: str) -> str:
        """The flag catalogue's file name under llmdeploy/engines/catalogues/ for `version`."""
        ...

    def container_image(self, recipe: Recipe) -> str:
        """`image`, or a variant of it the recipe needs (the built-in engine's CPU image)."""
        ...

    def health_command(self, url: str) -> list[str]:
        """A container healthcheck probing `url` with a tool the engine's image has."""
        ...

    def support_problems(self, recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
        """What the engine cannot run at all: architectures, dtypes, quantizations, parallelism."""
        ...

    def gpu_problems(self, recipe: Recipe, model: ModelSpec, gpu: GPUSpec) -> Iterator[Problem]:
        """Requirements this engine adds on the recipe's GPU (fp8 hardware, ...)."""
        ...

    def length_problems(self, recipe: Recipe, max_model_len: int) -> Iterator[Problem]:
        """Start-up refusals of the engine's scheduler for a context of `max_model_len` tokens."""
        ...

    def speculative_problems(self, recipe: Recipe) -> Iterator[Problem]:
        """Speculative decoding the engine cannot do; when any is found, the shared draft-model
        checks (vocabulary, size) are skipped."""
        ...

    def notes(self, recipe: Recipe, gpu: GPUSpec | None) -> list[str]:
        """Things worth knowing that are not errors (`validate` shows them)."""
        ...

    def map_flags(self, recipe: Recipe, plan: PlanFigures, flags: Flags) -> None:
        """Every recipe knob after host, port and model as flags / environment on `flags`; a knob
        it cannot honour goes to `flags.unsupported`, never dropped."""
        ...

    def plan_inputs(self, recipe: Recipe) -> PlanInputs:
        """What the memory plan reads from `recipe`: the engine-neutral inputs plus the engine's own
        (vLLM: the sampler backend its environment picks)."""
        ...

    def memory_plan(self, inputs: PlanInputs) -> MemoryPlan:
        """The engine's start-up memory accounting for `inputs` (problems included, no suggestions)."""
        ...

    def kv_capacity_from_metrics(self, samples: list[MetricSample]) -> KVCapacity | None:
        """The allocated KV cache size from the engine's own /metrics samples, if it states it."""
        ...

    def local_argv(self, rendered: list[str], executable: str, python: str | None) -> list[str]:
        """The rendered argv with its entry point replaced by the install found at `executable`
        (and the interpreter `python` it runs under, for Python engines)."""
        ...


class EngineDefaults:
    """What an engine has when it lacks a feature or adds no rule of that kind: inherit it, set the
    facts without a default (name, display_name, pinned_version, entrypoint, api_key_env, image,
    executable, install_hint) and override the rest where the engine differs."""

    name: str
    image: str
    entrypoint: tuple[str, ...]
    model_flag = "--model"
    host_flag = "--host"
    queue_metric: str | None = None
    kv_usage_metric: str | None = None
    reexports_metrics = False
    kv_log_line: re.Pattern[str] | None = None
    local_python: LocalPython | None = None
    local_flag_check: str | None = None
    bundled = False
    echoes_instance_id = False
    downloads_from_hub = True
    local_folder_env: tuple[tuple[str, str], ...] = ()
    gguf_as_checkpoint = False
    random_weights_prefix: str | None = None
    launch_python_var: str | None = None
    drain_timeout_s: int | None = None
    tgi_api = False
    accepts_ignore_eos = True
    takes_mem_fraction_static = False

    def catalogue_file(self, version: str) -> str:
        return f"{self.name}-{version}.json"

    def container_image(self, recipe: Recipe) -> str:
        return self.image

    def support_problems(self, recipe: Recipe, model: ModelSpec) -> Iterator[Problem]:
        return iter(())

    def gpu_problems(self, recipe: Recipe, model: ModelSpec, gpu: GPUSpec) -> Iterator[Problem]:
        return iter(())

    def length_problems(self, recipe: Recipe, max_model_len: int) -> Iterator[Problem]:
        return iter(())

    def speculative_problems(self, recipe: Recipe) -> Iterator[Problem]:
        return iter(())

    def notes(self, recipe: Recipe, gpu: GPUSpec | None) -> list[str]:
        return []

    def plan_inputs(self, recipe: Recipe) -> PlanInputs:
        from llmdeploy.memory.plan_inputs import inputs_from_recipe  # the catalog loads on first use

        return inputs_from_recipe(recipe)

    def kv_capacity_from_metrics(self, samples: list[MetricSample]) -> KVCapacity | None:
        return None

    def health_command(self, url: str) -> list[str]:
        # engine images are Python images; none is guaranteed to have curl
        return ["CMD", "python3", "-c", f"import urllib.request; urllib.request.urlopen({url!r})"]

    def local_argv(self, rendered: list[str], executable: str, python: str | None) -> list[str]:
        assert tuple(rendered[: len(self.entrypoint)]) == self.entrypoint, rendered
        return [executable, *rendered[1:]]
