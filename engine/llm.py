"""Offline API shaped like vLLM's `LLM`, so `LLM(model=...).generate(prompts, params)` code moves over.

A list of prompts is added to the engine at once and run with continuous batching; results come back
one per prompt, in the order given.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence as Seq
from dataclasses import fields
from typing import Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.facts import DEFAULT_GPU_MEMORY_UTILIZATION
from llmdeploy_engine.llm_engine import LLMEngine
from llmdeploy_engine.outputs import RequestOutput
from llmdeploy_engine.sampling_params import RequestOutputKind, SamplingParams

# vLLM keyword arguments that have no meaning here but that vLLM scripts commonly pass
_ACCEPTED_NOOPS = {"trust_remote_code", "disable_log_stats", "download_dir", "load_format"}

PromptType = str | dict[str, Any]
Message = dict[str, Any]


class LLM:
    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        dtype: str = "auto",
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        max_model_len: int | None = None,
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
        tensor_parallel_size: int = 1,
        kv_cache_memory_bytes: int | None = None,
        device: str = "auto",
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(kwargs) - known - _ACCEPTED_NOOPS)
        if unknown:
            raise TypeError(f"LLM() got unknown engine arguments {unknown}; known ones: {sorted(known)}")
        extra = {k: v for k, v in kwargs.items() if k in known}
        config = EngineConfig(
            model=model,
            tokenizer=tokenizer,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
            tensor_parallel_size=tensor_parallel_size,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
            device=device,
            seed=seed,
            **extra,
        )
        self.llm_engine = LLMEngine(config)
        self._ids = itertools.count()

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> LLM:
        """Wrap an already built engine (tests, or several front ends on one engine)."""
        llm = cls.__new__(cls)
        llm.llm_engine = engine
        llm._ids = itertools.count()
        return llm

    def get_tokenizer(self) -> Any:
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Seq[PromptType],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """One RequestOutput per prompt, in order. A prompt is text, {"prompt": text} or
        {"prompt_token_ids": [...]}."""
        items = [prompts] if isinstance(prompts, str | dict) else list(prompts)
        return self._run([_prompt_of(p) for p in items], sampling_params, use_tqdm)

    def chat(
        self,
        messages: list[Message] | list[list[Message]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """Render each conversation with the model's chat template and generate a reply for it."""
        single = bool(messages) and isinstance(messages[0], dict)
        conversations: list[list[Message]] = [messages] if single else messages  # type: ignore[list-item,assignment]
        tok = self.llm_engine.tokenizer
        prompts: list[tuple[str | None, list[int] | None]] = []
        for conv in conversations:
            text = tok.apply_chat_template(
                conv, add_generation_prompt=add_generation_prompt, **(chat_template_kwargs or {})
            )
            # the template already writes any BOS / special tokens
            prompts.append((text, tok.encode(text, add_special_tokens=False)))
        return self._run(prompts, sampling_params, use_tqdm)

    def _run(
        self,
        prompts: list[tuple[str | None, list[int] | None]],
        sampling_params: SamplingParams | Seq[SamplingParams] | None,
        use_tqdm: bool,
    ) -> list[RequestOutput]:
        if sampling_params is None:
            params_list = [SamplingParams()] * len(prompts)
        elif isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(params_list)} sampling params for {len(prompts)} prompts")
        # only the final output of each request is read: the engine builds nothing per step for it
        final_only: dict[int, SamplingParams] = {}
        for i, p in enumerate(params_list):
            if p.output_kind is not RequestOutputKind.FINAL_ONLY:
                if id(p) not in final_only:
                    final_only[id(p)] = dataclasses.replace(p, output_kind=RequestOutputKind.FINAL_ONLY)
                params_list[i] = final_only[id(p)]
        engine = self.llm_engine
        # validate every prompt before adding any, so one bad prompt leaves nothing behind
        processed = []
        for (text, ids), params in zip(prompts, params_list, strict=True):
            _, prompt_ids, max_tokens = engine.process_prompt(ids if ids is not None else text or "", params)
            processed.append((text, prompt_ids, params, max_tokens))
        request_ids = [f"llm-{next(self._ids)}" for _ in processed]
        for rid, (text, ids, params, max_tokens) in zip(request_ids, processed, strict=True):
            engine.add_processed_request(rid, text, ids, params, max_tokens)
        results: dict[str, RequestOutput] = {}
        bar = _progress(len(request_ids)) if use_tqdm else None
        try:
            while engine.has_unfinished_requests():
                for out in engine.step():
                    if out.finished and out.request_id in request_ids:
                        results[out.request_id] = out
                        if bar is not None:
                            bar.update(1)
        except BaseException:
            for rid in request_ids:
                engine.abort_request(rid)
            raise
        finally:
            if bar is not None:
                bar.close()
        return [results[rid] for rid in request_ids]


def _prompt_of(p: PromptType) -> tuple[str | None, list[int] | None]:
    if isinstance(p, str):
        return p, None
    if isinstance(p, dict):
        if "prompt_token_ids" in p:
            return p.get("prompt"), [int(t) for t in p["prompt_token_ids"]]
        if "prompt" in p:
            return str(p["prompt"]), None
    raise TypeError(f"a prompt is a string, {{'prompt': str}} or {{'prompt_token_ids': [...]}}; got {p!r}")


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc="Processed prompts", dynamic_ncols=True)
