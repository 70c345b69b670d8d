"""The recipe schema: `Recipe`, one frozen pydantic model per section, unknown keys rejected.

Parsing happens once at the border (`llmdeploy.recipe.load_recipe`); everything downstream takes a
`Recipe`, never a dict. The sections live in `serving_schema` (model, hardware, engine, server,
smoke, bench) and `target_schema` (local, docker, kubernetes); this module names them all, so
`from llmdeploy.recipe.schema import ...` reaches every section.
"""

from __future__ import annotations

from pydantic import Field

from llmdeploy.recipe.kubernetes_placement import ModelCache, Probes, Toleration
from llmdeploy.recipe.serving_schema import (
    ApiKeyFromEnv,
    ApiKeyFromSecret,
    BenchSection,
    EngineSection,
    EngineType,
    HardwareSection,
    KVCacheDtype,
    KVCacheSection,
    LengthRange,
    LimitsSection,
    ModelDtype,
    ModelSection,
    PackagedFile,
    ParallelismSection,
    Quantization,
    SecretRef,
    Section,
    ServerSection,
    SLOs,
    SmokePrompt,
    SmokeSection,
    SpeculativeSection,
)
from llmdeploy.recipe.target_schema import (
    Autoscaling,
    DockerTarget,
    KubernetesTarget,
    LocalTarget,
    Target,
)

__all__ = [
    "ApiKeyFromEnv",
    "ApiKeyFromSecret",
    "Autoscaling",
    "BenchSection",
    "DockerTarget",
    "EngineSection",
    "EngineType",
    "HardwareSection",
    "KVCacheDtype",
    "KVCacheSection",
    "KubernetesTarget",
    "LengthRange",
    "LimitsSection",
    "LocalTarget",
    "ModelCache",
    "ModelDtype",
    "ModelSection",
    "PackagedFile",
    "ParallelismSection",
    "Probes",
    "Quantization",
    "Recipe",
    "SLOs",
    "SecretRef",
    "Section",
    "ServerSection",
    "SmokePrompt",
    "SmokeSection",
    "SpeculativeSection",
    "Target",
    "Toleration",
]


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
