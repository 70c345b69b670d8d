"""Tensor-parallel workers: ranks 1..N-1 as child processes running `llmdeploy_engine.runner.tp_worker.main`.

Rank 0 (the process running LLMEngine) starts them from its ModelRunner (`WorkerGroup.start`) and
feeds them commands over their stdin pipes, pickled: ("execute", ForwardBatch) every step or
("execute_multi", ...) every decode window (("launch_multi", ...) for an asynchronous one, whose
ids the worker never reads: a following window gathers its step-0 inputs from them on the device),
sent before rank 0 runs the same, ("capture_graphs",)
once before rank 0 captures its CUDA graphs (every rank captures the same graphs in the same order,
with the same rows computing their logits inside, and later replays the same graph, since the choice
depends only on the batch), and ("close",). Each worker builds its own ModelRunner shard and KV cache
and runs every step's forward in lockstep with rank 0 (the collectives inside the layers pair them
up). A single step's logits are dropped (rank 0 samples); in a decode window every rank samples the
same tokens itself (TensorParallelDriver.execute_multi_step says why).

Shutdown: on ("close",), on end of input (rank 0 closed the pipe or died) and, while blocked in a
collective, through a watchdog that sees rank 0 is gone (parent pid changed). Rank 0 waits for its
workers on close and kills what is left, and logs (on CUDA: exits, since an NCCL collective would
wait forever) if a worker dies while running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pickle
import subprocess
import sys
import threading
import time
from typing import IO, Any

from llmdeploy_engine.config import EngineConfig
from llmdeploy_engine.core.runner_interface import Runner
from llmdeploy_engine.parallel.distributed import SAFE_NCCL_ENV

logger = logging.getLogger("llmdeploy_engine")

CLOSE_TIMEOUT_S = 30.0

# `python -c` program of a worker: import llmdeploy_engine from argv[1] if it is not importable as is
_BOOTSTRAP = """
import importlib.util, os, sys
if importlib.util.find_spec("llmdeploy_engine") is None:
    d = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "llmdeploy_engine", os.path.join(d, "__init__.py"), submodule_search_locations=[d])
    module = importlib.util.module_from_spec(spec)
    sys.modules["llmdeploy_engine"] = module
    spec.loader.exec_module(module)
from llmdeploy_engine.runner.tp_worker import main
sys.exit(main())
"""


def _send(pipe: IO[bytes], msg: tuple[Any, ...]) -> None:
    pickle.dump(msg, pipe, protocol=pickle.HIGHEST_PROTOCOL)
    pipe.flush()


class WorkerGroup:
    """Rank 0's handle on ranks 1..N-1."""

    def __init__(self, procs: list[subprocess.Popen[bytes]], device_type: str) -> None:
        self.procs = procs
        self.device_type = device_type
        self.closing = False
        self._lock = threading.Lock()
        self._monitor = threading.Thread(target=self._watch, name="tp-worker-monitor", daemon=True)
        self._monitor.start()
        atexit.register(self.close)  # an engine never closed still stops its workers politely

    @classmethod
    def start(cls, config: EngineConfig, port: int, device_type: str) -> WorkerGroup:
        env = dict(os.environ)
        env.update(SAFE_NCCL_ENV)  # never multicast, whatever the parent's environment says
        import llmdeploy_engine

        # the child imports the package from the folder this one came from, installed or not
        package_dir = os.path.dirname(os.path.abspath(llmdeploy_engine.__file__))
        procs = []
        world = config.tensor_parallel_size
        for rank in range(1, world):
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, package_dir],
                stdin=subprocess.PIPE,
                env=env,
            )
            assert proc.stdin is not None
            _send(proc.stdin, ("init", config, rank, world, port, os.getpid()))
            procs.append(proc)
        return cls(procs, device_type)

    def _watch(self) -> None:
        while True:
            for rank, proc in enumerate(self.procs, start=1):
                code = proc.poll()
                if code is not None and not self.closing:
                    logger.error("tensor-parallel worker rank %d exited with code %s", rank, code)
                    if self.device_type == "cuda":
                        # rank 0 would wait in an NCCL collective forever: stop the whole engine
                        logger.error("stopping: a tensor-parallel rank is gone")
                        os._exit(1)
                    return
            if self.closing:
                return
            time.sleep(0.5)

    def send(self, msg: tuple[Any, ...]) -> None:
        data = pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL)  # once for all workers
        with self._lock:
            for rank, proc in enumerate(self.procs, start=1):
                assert proc.stdin is not None
                try:
                    proc.stdin.write(data)
                    proc.stdin.flush()
                except (BrokenPipeError, OSError) as exc:
                    raise RuntimeError(f"tensor-parallel worker rank {rank} is gone ({exc})") from exc

    def request_close(self) -> None:
        """Ask every worker to stop (they leave the process group, then exit); returns at once."""
        if self.closing:
            return
        self.closing = True
        for proc in self.procs:
            with contextlib.suppress(BrokenPipeError, OSError, ValueError):
                assert proc.stdin is not None
                _send(proc.stdin, ("close",))
                proc.stdin.close()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Ask every worker to stop, wait up to timeout_s for all of them, kill what is left."""
        self.request_close()
        deadline = time.monotonic() + timeout_s
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


class TensorParallelDriver(Runner):
    """Rank 0's outermost runner: hands each step to the workers, then runs it here.

    `execute` has ModelRunner's contract; the Runner interface's values are the wrapped runner's.
    """

    def __init__(self, runner: Any, workers: WorkerGroup) -> None:
        self.runner = runner
        self.workers = workers
        self.take_values(runner)
        self.multi_step_sampling = runner.multi_step_sampling

    @property
    def startup_report(self) -> Any:
        return self.runner.startup_report

    def execute(self, batch: Any) -> Any:
        self.workers.send(("execute", batch))
        return self.runner.execute(batch)

    def execute_multi_step(self, batch: Any, num_steps: int, params: Any = None, seed: Any = None) -> Any:
        # ("execute_multi", batch, num_steps, params, seed): a decode window (multi_step.py); every
        # rank's logits are the same after the vocab all-gather and every rank's sampling noise comes
        # from the same seed, so every rank feeds the same tokens
        self.workers.send(("execute_multi", batch, num_steps, params, seed))
        return self.runner.execute_multi_step(batch, num_steps, params, seed)

    def launch_multi_step(
        self,
        batch: Any,
        num_steps: int,
        params: Any = None,
        seed: Any = None,
        follow: Any = None,
        follow_rows: Any = None,
    ) -> Any:
        # ("launch_multi", ...): an asynchronous window (multi_step.py); a worker follows the window
        # it launched last (rank 0 only ever follows its own last window, so theirs is the same one)
        self.workers.send(("launch_multi", batch, num_steps, params, seed, follow_rows))
        return self.runner.launch_multi_step(batch, num_steps, params, seed, follow, follow_rows)

    def close(self) -> None:
        self.runner.close()


def _die_with_parent(parent_pid: int) -> None:
    # (not PR_SET_PDEATHSIG: it fires when the *thread* that started us exits, not the process)
    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(0)
            time.sleep(0.5)

    threading.Thread(target=watch, name="tp-parent-watchdog", daemon=True).start()
    if os.getppid() != parent_pid:
        os._exit(0)


def main() -> int:
    stdin = sys.stdin.buffer
    kind, config, rank, world, port, parent_pid = pickle.load(stdin)
    if kind != "init":
        raise RuntimeError(f"tp_worker: expected an init message, got {kind!r}")
    _die_with_parent(parent_pid)
    logging.basicConfig(level=logging.WARNING, format=f"[tp rank {rank}] %(levelname)s %(message)s")

    import torch
    from llmdeploy_engine.parallel.distributed import destroy_parallel
    from llmdeploy_engine.runner.model_runner import ModelRunner

    if config.device == "cpu" or (config.device == "auto" and not torch.cuda.is_available()):
        # the ranks share the host's cores
        torch.set_num_threads(max(1, torch.get_num_threads() // world))
    runner = ModelRunner(config, rank=rank, port=port)
    top: Any = runner
    last_window: Any = None  # the window this rank launched last (asynchronous windows follow it)
    while True:
        try:
            msg = pickle.load(stdin)
        except EOFError:  # rank 0 closed the pipe or died
            break
        if msg[0] == "execute":
            top.execute(msg[1])
        elif msg[0] == "execute_multi":
            top.execute_multi_step(*msg[1:])
            last_window = None
        elif msg[0] == "launch_multi":
            batch, num_steps, params, seed, follow_rows = msg[1:]
            follow = last_window if follow_rows is not None else None
            last_window = top.launch_multi_step(batch, num_steps, params, seed, follow, follow_rows)
        elif msg[0] == "capture_graphs":
            from llmdeploy_engine.runner.cuda_graph_runner import CudaGraphRunner

            top = CudaGraphRunner(runner, logits_max_batch=runner.graph_logits_rows())  # as rank 0
        elif msg[0] == "close":
            break
        else:
            raise RuntimeError(f"tp_worker: unknown command {msg[0]!r}")
    release = getattr(top, "release_graphs", None)
    if callable(release):
        release()
    # rank 0 leaves the group at the same time (freeing symmetric memory takes every rank)
    destroy_parallel(runner.parallel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
