"""llmdeploy's built-in inference engine (import name `llmdeploy_engine`, folder `engine/`).

The only part of llmdeploy that imports torch. Layout:
- llm_engine / async_engine / llm: the request loop and its APIs; config, cli, cli_args: arguments;
  facts: the facts the toolkit shares (torch-free);
- core/: the batching core (scheduler, block manager, sequences, stop checks, decode windows,
  outputs), never imports torch;
- runner/: the Runner interface, the model runner, CUDA graphs, tensor parallelism;
- model/: the decoder model, attention, sampler; kernels/: Triton kernels and ops;
- loading/: GGUF / Hugging Face / quantized checkpoints, random weights, tokenizers;
- server/: the OpenAI- and TGI-compatible HTTP server; spec_decode/: speculative decoding.
"""

from typing import Any

# vLLM-style top-level names, loaded on first use so torch-free modules (cli_args) stay torch-free.
_EXPORTS = {
    "LLM": "llmdeploy_engine.llm",
    "SamplingParams": "llmdeploy_engine.sampling_params",
    "RequestOutputKind": "llmdeploy_engine.sampling_params",
    "AsyncLLMEngine": "llmdeploy_engine.async_engine",
    "LLMEngine": "llmdeploy_engine.llm_engine",
    "EngineConfig": "llmdeploy_engine.config",
    "RequestOutput": "llmdeploy_engine.outputs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'llmdeploy_engine' has no attribute {name!r}")
