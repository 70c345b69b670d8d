"""Load tests of any OpenAI-compatible endpoint (vLLM, TGI's OpenAI routes, the built-in engine)."""

from llmdeploy.bench.options import BenchOptions, LengthSpec
from llmdeploy.bench.report import BenchReport, LevelReport
from llmdeploy.bench.sweep import bench

__all__ = ["BenchOptions", "BenchReport", "LengthSpec", "LevelReport", "bench"]
