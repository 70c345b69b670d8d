"""Model and GPU catalog: architecture facts, exact parameter counts, GPU memory as CUDA reports it."""

from llmdeploy.catalog.gpus import GPUSpec, list_gpus, resolve_gpu
from llmdeploy.catalog.model_spec import ModelSpec, ParamCount
from llmdeploy.catalog.models import list_models, resolve_model

__all__ = ["GPUSpec", "ModelSpec", "ParamCount", "list_gpus", "list_models", "resolve_gpu", "resolve_model"]
