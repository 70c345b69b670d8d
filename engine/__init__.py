"""llmdeploy's built-in inference engine (import name `llmdeploy_engine`, folder `engine/`).

The only part of llmdeploy that imports torch. Parts, one noun per module: loader, tokenizer, model,
block_manager, scheduler, model_runner, sampler, llm_engine, async_engine, server.
"""
