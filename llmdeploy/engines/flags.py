"""The flag collector an engine's `map_flags` writes to, and the mappings several engines share.

Every recipe knob becomes a flag or an environment variable; one the engine cannot honour is
recorded with `unsupported`, so `render` reports every such knob at once.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from llmdeploy.errors import Problem

if TYPE_CHECKING:  # the recipe models (pydantic) stay unimported: `plan --model` needs none
    from llmdeploy.recipe.schema import ModelSection, Recipe

_TO_TP = "use parallelism.tensor, or engine.type: sglang or vllm"
# the recipe field behind each flag whose value is free text
_FLAG_FIELDS = {
    "--host": "server.host",
    "--hostname": "server.host",
    "--model": "model",
    "--model-id": "model",
    "--served-model-name": "server.served_model_name",
    "--revision": "model.revision",
}


def is_gguf(model: ModelSection) -> bool:
    """The model is a GGUF file (by its quantization or its file name)."""
    source = model.path or (model.pypi.file if model.pypi else "")
    return model.quantization == "gguf" or source.endswith(".gguf")


class Flags:
    """Collects argv, environment and the problems found, so every unsupported knob is reported at once."""

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

    def refuse_where(self, *rows: tuple[bool, str, object, str, str]) -> None:
        """`unsupported(path, value, why, fix)` for each (refused, path, value, why, fix) row refused."""
        for refused, path, value, why, fix in rows:
            if refused:
                self.unsupported(path, value, why, fix)

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


def model_flags(
    recipe: Recipe,
    flags: Flags,
    dtypes: tuple[str, ...],
    quantization: dict[str, str],
    quantize_flag: str = "--quantization",
    quantize_gguf: bool = False,
    local_files_only: bool = False,
) -> None:
    """--dtype, the quantization method (spelled per engine in `quantization`), --revision and
    --trust-remote-code; `quantize_gguf`: GGUF is a method to name, not a file format it reads;
    `local_files_only`: it loads local files and its own model code only."""
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
    if model.quantization not in ("none", "gguf") or (model.quantization == "gguf" and quantize_gguf):
        method = quantization.get(model.quantization)
        if method is None:
            flags.unsupported(
                "model.quantization",
                model.quantization,
                f"supported: {', '.join(sorted(quantization))}",
                "choose a supported method or a pre-quantized checkpoint, or change engine.type",
            )
        else:
            flags.add(quantize_flag, method)
    if model.revision is not None:
        if local_files_only:
            flags.unsupported(
                "model.revision", model.revision, "it loads local files only", "remove model.revision"
            )
        else:
            flags.add("--revision", model.revision)
    if model.trust_remote_code:
        if local_files_only:
            flags.unsupported(
                "model.trust_remote_code",
                True,
                "it runs only its own model code",
                "set model.trust_remote_code: false",
            )
        else:
            flags.add("--trust-remote-code")


def kv_dtype_flag(recipe: Recipe, flags: Flags, flag: str, spellings: dict[str, str]) -> None:
    """`flag` with the engine's spelling of kv_cache.dtype (nothing for auto)."""
    dtype = recipe.kv_cache.dtype
    if dtype == "auto":
        return
    spelled = spellings.get(dtype)
    if spelled is None:
        flags.unsupported(
            "kv_cache.dtype",
            dtype,
            "its KV cache follows the model dtype or takes fp8 only",
            "use kv_cache.dtype: auto (and model.dtype for fp16/bf16) or an fp8 variant",
        )
        return
    flags.add(flag, spelled)


def vllm_style_parallel(recipe: Recipe, flags: Flags, single_node: bool) -> None:
    """--tensor-parallel-size, --pipeline-parallel-size and Ray across nodes (vLLM's names);
    `single_node`: the engine has neither pipeline parallelism nor more than one node."""
    par, nodes = recipe.parallelism, recipe.hardware.nodes
    if par.tensor > 1:
        flags.add("--tensor-parallel-size", str(par.tensor))
    if single_node:
        flags.refuse_where(
            (
                par.pipeline > 1,
                "parallelism.pipeline",
                par.pipeline,
                "it has no pipeline parallelism",
                _TO_TP,
            ),
            (
                nodes > 1,
                "hardware.nodes",
                nodes,
                "it runs on one node",
                "use hardware.nodes: 1, or engine.type: vllm",
            ),
        )
        return
    if par.pipeline > 1:
        flags.add("--pipeline-parallel-size", str(par.pipeline))
    if nodes > 1:
        flags.add("--distributed-executor-backend", "ray")


def vllm_style_flags(
    recipe: Recipe,
    flags: Flags,
    kv_dtypes: dict[str, str],
    quantization: dict[str, str],
    load_flags: tuple[tuple[str, str], ...] = (),
    single_node: bool = False,
    local_files_only: bool = False,
) -> None:
    """Everything after host, port and model under vLLM's flag names (vLLM and the built-in engine):
    model, `load_flags` (how the weights load), KV dtype, parallelism and limits; `single_node` as
    for `vllm_style_parallel`, `local_files_only` as for `model_flags`."""
    model_flags(
        recipe, flags, ("float16", "bfloat16", "float32"), quantization, local_files_only=local_files_only
    )
    for flag, value in load_flags:
        flags.add(flag, value)
    kv_dtype_flag(recipe, flags, "--kv-cache-dtype", kv_dtypes)
    vllm_style_parallel(recipe, flags, single_node)
    vllm_style_limits(recipe, flags)


def vllm_style_limits(recipe: Recipe, flags: Flags) -> None:
    """Context, batch, memory, block and prefix-caching limits under vLLM's flag names."""
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


def speculative_config_json(recipe: Recipe, draft_ref: str | None) -> str:
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
