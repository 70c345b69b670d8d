"""Calibration: KV-cache capacities measured on the user's own GPUs, kept in a file the user owns.

`llmdeploy smoke RECIPE --calibration FILE` records what the running engine allocated next to what the
planner predicted, keyed by everything the memory rule reads (model, GPU, engine and version,
parallelism, context length, dtypes, batch limits). `llmdeploy plan RECIPE --calibration FILE` then
answers with the measured capacity where a record matches and shows modeled and measured side by side,
so a CI gate can rest on numbers measured on the team's GPUs. The file is YAML, one record per
setting (a new measurement replaces the old one), sorted, so it reviews well in a pull request.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from llmdeploy.errors import UserError
from llmdeploy.memory.memory_plan import MemoryPlan
from llmdeploy.memory.plan_inputs import PlanInputs

_HEADER = (
    "# llmdeploy calibration: KV cache capacities measured by `llmdeploy smoke --calibration`.\n"
    "# `llmdeploy plan --calibration` uses a record whose settings all match the recipe.\n"
)
_FIX = (
    "remove the file (or the bad record) and measure again with `llmdeploy smoke RECIPE --calibration FILE`"
)


@dataclass(frozen=True)
class CalibrationKey:
    model: str
    gpu: str
    device: str
    engine: str
    engine_version: str  # as the recipe pins it; "unpinned" when it does not
    tensor_parallel_size: int
    pipeline_parallel_size: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    dtype: str
    quantization: str
    kv_cache_dtype: str
    block_size: int
    kv_cache_memory_gib: float | None
    enforce_eager: bool
    draft_model: str | None


@dataclass(frozen=True)
class CalibrationRecord:
    key: CalibrationKey
    predicted_kv_cache_tokens: int
    actual_kv_cache_tokens: int
    source: str  # where the actual figure was read, e.g. "/metrics llmdeploy:kv_cache_tokens"
    measured_on: str  # ISO date

    @property
    def gap_fraction(self) -> float:
        return (self.actual_kv_cache_tokens - self.predicted_kv_cache_tokens) / max(
            1, self.predicted_kv_cache_tokens
        )

    def to_yaml(self) -> dict[str, Any]:
        return {
            **asdict(self.key),
            "predicted_kv_cache_tokens": self.predicted_kv_cache_tokens,
            "actual_kv_cache_tokens": self.actual_kv_cache_tokens,
            "source": self.source,
            "measured_on": self.measured_on,
        }


def key_for(inputs: PlanInputs, plan: MemoryPlan) -> CalibrationKey:
    """The settings a capacity depends on, with defaults resolved as the plan resolved them."""
    return CalibrationKey(
        model=inputs.spec.hf_id,
        gpu=plan.gpu,
        device=inputs.device,
        engine=inputs.engine,
        engine_version=inputs.engine_version or "unpinned",
        tensor_parallel_size=inputs.tensor_parallel_size,
        pipeline_parallel_size=inputs.pipeline_parallel_size,
        max_model_len=plan.max_model_len,
        max_num_seqs=plan.max_num_seqs,
        max_num_batched_tokens=plan.max_num_batched_tokens,
        gpu_memory_utilization=inputs.gpu_memory_utilization,
        dtype=inputs.dtype,
        quantization=plan.quantization,
        kv_cache_dtype=plan.kv_cache_dtype,
        block_size=plan.block_size,
        kv_cache_memory_gib=inputs.kv_cache_memory_gib,
        enforce_eager=inputs.enforce_eager,
        draft_model=inputs.draft.hf_id if inputs.draft is not None else None,
    )


def read_calibration(path: Path) -> tuple[CalibrationRecord, ...]:
    """Every record of `path`; a missing file is an empty calibration."""
    if not path.exists():
        return ()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError.one(
            f"cannot read the calibration file ({type(e).__name__})", file=str(path), fix=_FIX
        ) from None
    items = (raw or {}).get("measurements", []) if isinstance(raw, dict) else None
    if not isinstance(items, list):
        raise UserError.one("a calibration file holds a `measurements:` list", file=str(path), fix=_FIX)
    key_names = [f.name for f in fields(CalibrationKey)]
    records = []
    for i, item in enumerate(items):
        try:
            key = CalibrationKey(**{name: item[name] for name in key_names})
            records.append(
                CalibrationRecord(
                    key,
                    int(item["predicted_kv_cache_tokens"]),
                    int(item["actual_kv_cache_tokens"]),
                    str(item["source"]),
                    str(item["measured_on"]),
                )
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UserError.one(
                f"record {i + 1} is incomplete or malformed ({type(e).__name__}: {e})",
                file=str(path),
                path=f"measurements[{i}]",
                fix=_FIX,
            ) from None
    return tuple(records)


def record_measurement(path: Path, record: CalibrationRecord) -> tuple[CalibrationRecord, ...]:
    """Add `record` to `path`, replacing a record of the same settings; returns the file's records."""
    kept = [r for r in read_calibration(path) if r.key != record.key]
    records = sorted([*kept, record], key=lambda r: tuple(str(v) for v in asdict(r.key).values()))
    body = yaml.safe_dump({"measurements": [r.to_yaml() for r in records]}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(_HEADER + body, encoding="utf-8")
    tmp.replace(path)
    return tuple(records)


def new_record(inputs: PlanInputs, plan: MemoryPlan, actual_tokens: int, source: str) -> CalibrationRecord:
    return CalibrationRecord(
        key_for(inputs, plan), plan.kv_cache_tokens, actual_tokens, source, dt.date.today().isoformat()
    )


@dataclass(frozen=True)
class CalibratedPlan:
    """A plan whose KV capacity comes from a measurement; `modeled` keeps what the memory model said."""

    modeled: MemoryPlan
    record: CalibrationRecord
    calibration_file: str

    @property
    def plan(self) -> MemoryPlan:
        actual = self.record.actual_kv_cache_tokens
        m = self.modeled
        scale = actual / m.kv_cache_tokens if m.kv_cache_tokens > 0 else 0.0
        concurrency = m.max_concurrency * scale if m.kv_cache_tokens > 0 else actual / max(1, m.max_model_len)
        return replace(
            m,
            kv_cache_tokens=actual,
            num_kv_blocks=actual // m.block_size,
            max_concurrency=concurrency,
            kv_cache_gib=m.kv_cache_gib * scale if m.kv_cache_tokens > 0 else m.kv_cache_gib,
            fits=m.fits and concurrency >= 1.0,
        )

    def to_json(self) -> dict[str, Any]:
        out = self.plan.to_json()
        modeled = self.modeled.to_json()
        out["modeled"] = {
            k: modeled[k]
            for k in ("kv_cache_gib", "kv_cache_tokens", "num_kv_blocks", "max_concurrency", "fits")
        }
        out["calibration"] = {"file": self.calibration_file, **self.record.to_yaml()}
        return out

    def to_table(self) -> str:
        m, c, r = self.modeled, self.plan, self.record
        gap = (c.kv_cache_tokens - m.kv_cache_tokens) / max(1, m.kv_cache_tokens)
        lines = [
            m.to_table(),
            "",
            f"  calibrated from {self.calibration_file} (measured {r.measured_on}, {r.source}):",
            f"  {'':<22}{'modeled':>12}{'measured':>12}",
            f"  {'KV cache tokens':<22}{m.kv_cache_tokens:>12,}{c.kv_cache_tokens:>12,}  ({gap:+.1%})",
            f"  {'max concurrency':<22}{m.max_concurrency:>12.2f}{c.max_concurrency:>12.2f}",
            f"  {'fits':<22}{'yes' if m.fits else 'NO':>12}{'yes' if c.fits else 'NO':>12}",
        ]
        return "\n".join(lines)


def calibrate(
    inputs: PlanInputs, plan: MemoryPlan, records: tuple[CalibrationRecord, ...], file: str
) -> CalibratedPlan | None:
    key = key_for(inputs, plan)
    for record in records:
        if record.key == key:
            return CalibratedPlan(plan, record, file)
    return None
