"""`smoke()`: is the endpoint up, does it answer in each protocol, and is its KV cache what the plan said?"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Protocol, TextIO, TypeVar

import httpx

from llmdeploy.engines import get_engine
from llmdeploy.engines.base import KVCapacity
from llmdeploy.recipe.schema import Recipe
from llmdeploy.smoke import openai_checks, tgi_checks
from llmdeploy.smoke.health import wait_for_health
from llmdeploy.smoke.identity import EngineIdentity
from llmdeploy.smoke.kv_capacity import capacity_from_log, capacity_from_metrics
from llmdeploy.smoke.report import CheckResult, KVComparison, SmokeReport

T = TypeVar("T")
_DEFAULT_STARTUP_S = 60.0
_GENERATION_TIMEOUT_S = 300.0  # a CPU engine on a busy machine is slow; a hung one still ends


class PlanLike(Protocol):
    """What smoke reads from `llmdeploy.planner.MemoryPlan`."""

    @property
    def kv_cache_tokens(self) -> int: ...


def _timed(name: str, check: Callable[[], T]) -> tuple[CheckResult, T | None]:
    start = time.perf_counter()
    try:
        value = check()
    except openai_checks.CheckFailed as e:
        return CheckResult(name, False, str(e), time.perf_counter() - start), None
    except httpx.TimeoutException:
        return CheckResult(name, False, "timed out", time.perf_counter() - start), None
    except httpx.HTTPError as e:
        return CheckResult(name, False, f"{type(e).__name__}: {e}", time.perf_counter() - start), None
    except (AttributeError, KeyError, TypeError, ValueError, IndexError) as e:
        # a reply of an unexpected shape is the endpoint's failure, reported as the check's reason
        reason = f"unexpected reply shape ({type(e).__name__}: {e})"
        return CheckResult(name, False, reason, time.perf_counter() - start), None
    return CheckResult(name, True, _summary(value), time.perf_counter() - start), value


def _identity_check(identity: EngineIdentity, client: httpx.Client, base_url: str) -> str:
    found = identity.mismatch(client, base_url)
    if found is not None:
        raise openai_checks.CheckFailed(f"not the engine this apply started: {found}")
    what = (
        f"instance {identity.instance_id}"
        if identity.instance_id
        else f"serves {identity.served_model_name!r}"
    )
    return what


def _summary(value: object) -> str:
    if isinstance(value, openai_checks.StreamSummary):
        value = value.text
    if isinstance(value, str):
        return repr(value.strip()[:60])
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)[:100]
    return ""


def api_key_from_recipe(recipe: Recipe) -> str | None:
    """The key a recipe names through {env: VAR}; a Kubernetes secret is not readable here (give --api-key)."""
    ref = recipe.server.api_key
    env_name = getattr(ref, "env", None)
    return os.environ.get(env_name) if isinstance(env_name, str) else None


def url_from_recipe(recipe: Recipe) -> str:
    host = recipe.server.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{recipe.server.port}"


def _plan_for(recipe: Recipe, warnings: list[str]) -> PlanLike | None:
    try:
        from llmdeploy.planner import make_plan  # built alongside; smoke works without it
    except ImportError:
        warnings.append("no planner available; KV capacity not compared with a plan")
        return None
    try:
        plan: PlanLike = make_plan(recipe)
    except Exception as e:  # a recipe the planner cannot size still gets its endpoint checked
        warnings.append(f"could not plan the recipe ({type(e).__name__}: {str(e)[:120]}); KV not compared")
        return None
    return plan


def smoke(
    url: str,
    model: str | None = None,
    recipe: Recipe | None = None,
    plan: PlanLike | None = None,
    api_key: str | None = None,
    startup_timeout_s: float | None = None,
    log_file: str | None = None,
    kv_tolerance: float | None = None,
    progress_stream: TextIO | None = sys.stderr,
    identity: EngineIdentity | None = None,
) -> SmokeReport:
    """Run every check against `url`; never raises for what the endpoint does (see SmokeReport.failures).

    With `identity` (an apply that started the engine), the first check is that the server answering
    is that engine; when it is not, nothing else is checked: the other server's answers prove nothing."""
    base_url = url.rstrip("/")
    warnings: list[str] = []
    if recipe is not None:
        model = model or recipe.server.served_model_name or recipe.model.id
        api_key = api_key or api_key_from_recipe(recipe)
        startup_timeout_s = startup_timeout_s or recipe.smoke.startup_timeout_s
        kv_tolerance = recipe.smoke.kv_tolerance if kv_tolerance is None else kv_tolerance
        if plan is None:
            plan = _plan_for(recipe, warnings)
    tolerance = 0.10 if kv_tolerance is None else kv_tolerance
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    checks: list[CheckResult] = []
    with httpx.Client(headers=headers, timeout=httpx.Timeout(_GENERATION_TIMEOUT_S, connect=10.0)) as client:
        health = wait_for_health(client, base_url, startup_timeout_s or _DEFAULT_STARTUP_S, progress_stream)
        checks.append(health)
        if not health.ok:
            return SmokeReport(base_url, model, tuple(checks), tuple(warnings), None)
        if identity is not None:
            ours, _ = _timed("engine identity", partial(_identity_check, identity, client, base_url))
            checks.append(ours)
            if not ours.ok:
                return SmokeReport(base_url, model, tuple(checks), tuple(warnings), None)

        result, served = _timed("list models", lambda: openai_checks.list_models(client, base_url))
        checks.append(result)
        if served and model is None:
            model = served[0]
        elif served and model not in served:
            checks.append(CheckResult("model served", False, f"{model!r} is not among {served}"))
        if model is None:
            return SmokeReport(base_url, model, tuple(checks), tuple(warnings), None)
        name = model

        checks.append(
            _timed("chat completion", lambda: openai_checks.chat_completion(client, base_url, name))[0]
        )
        result, stream = _timed(
            "streamed chat completion", lambda: openai_checks.streamed_chat_completion(client, base_url, name)
        )
        checks.append(result)
        if stream is not None and not stream.usage_seen:
            warnings.append("the stream sent no usage chunk for stream_options.include_usage")
        for i, prompt in enumerate(recipe.smoke.prompts if recipe else [], start=1):
            checks.append(
                _timed(
                    f"recipe prompt {i}",
                    partial(openai_checks.recipe_prompt, client, base_url, name, prompt),
                )[0]
            )
        if tgi_checks.tgi_info(client, base_url) is not None or (
            recipe and get_engine(recipe.engine.type).tgi_api
        ):
            checks.append(
                _timed(
                    "TGI InferenceClient.chat_completion",
                    lambda: tgi_checks.hub_chat_completion(base_url, name, api_key, _GENERATION_TIMEOUT_S),
                )[0]
            )
            checks.append(
                _timed(
                    "TGI InferenceClient.text_generation(stream)",
                    lambda: tgi_checks.hub_text_generation_stream(base_url, api_key, _GENERATION_TIMEOUT_S),
                )[0]
            )
        actual = read_kv_capacity(client, base_url, log_file)
    kv = KVComparison(None if plan is None else plan.kv_cache_tokens, actual, tolerance)
    return SmokeReport(base_url, model, tuple(checks), tuple(warnings), kv)


def read_kv_capacity(client: httpx.Client, base_url: str, log_file: str | None) -> KVCapacity | None:
    try:
        response = client.get(base_url + "/metrics")
        if response.status_code == 200:
            found = capacity_from_metrics(response.text)
            if found is not None:
                return found
    except httpx.HTTPError:
        pass
    return capacity_from_log(log_file) if log_file else None
