"""Smoke tests of a running endpoint (vLLM, TGI or the built-in engine), plus predicted-versus-actual KV."""

from llmdeploy.engines.base import KVCapacity
from llmdeploy.smoke.report import CheckResult, KVComparison, SmokeReport
from llmdeploy.smoke.runner import smoke

__all__ = ["CheckResult", "KVCapacity", "KVComparison", "SmokeReport", "smoke"]
