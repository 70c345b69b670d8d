"""The runner stack LLMEngine builds: a ModelRunner, wrapped in a CudaGraphRunner (decode steps replayed
from CUDA graphs) and, with tensor parallelism, a TensorParallelDriver (steps go to ranks 1..N-1 first).
Each layer implements runner_interface.Runner."""

from __future__ import annotations

import gc
import logging

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.runner_interface import Runner

logger = logging.getLogger("llmdeploy_engine")


def build_runner(config: EngineConfig) -> Runner:
    from llmdeploy_engine.runner.model_runner import ModelRunner

    # a first import that runs torch.fx.wrap (torch._dynamo's does, should anything import it)
    # leaves the frames on the stack, this one and so this engine included, in a cycle of
    # import frames that only the cyclic collector frees; a young-generation collection frees
    # it now (~1 ms)
    gc.collect(1)
    model_runner = ModelRunner(config)
    runner: Runner = model_runner
    if model_runner.device.type == "cuda" and not config.enforce_eager:
        if model_runner.graphs_with_tensor_parallel:
            # decode steps replayed from CUDA graphs captured now; with
            # tensor parallelism every rank captures the same graphs (all-reduces over
            # symmetric memory inside; the logits' all-gather inside with the push path, else
            # after the replay)
            from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner

            model_runner.capture_graphs_on_workers()
            runner = CudaGraphRunner(runner, logits_max_batch=model_runner.graph_logits_rows())
        else:
            logger.warning(
                "CUDA graphs with tensor_parallel_size > 1 need the symmetric-memory all-reduce "
                "(tp_all_reduce %s, or its set-up failed); decode steps run eagerly",
                config.tp_all_reduce,
            )
    if model_runner.workers is not None:  # tensor parallel: steps go to ranks 1..N-1 first
        from llmdeploy_engine.runner.tp_worker import TensorParallelDriver

        runner = TensorParallelDriver(runner, model_runner.workers)
    return runner
