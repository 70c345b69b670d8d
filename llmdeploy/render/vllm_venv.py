"""Where the separate vLLM CPU venv lives (made by tests/vllm/setup.sh), and preparing a GGUF model for it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from llmdeploy.errors import UserError

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "tests" / "vllm" / "setup.sh"
_CONVERTER = Path(__file__).with_name("gguf_to_hf.py")


def vllm_venv() -> Path:
    return Path(os.environ.get("LLMDEPLOY_VLLM_VENV") or REPO_ROOT / ".venv-vllm")


def vllm_python() -> Path | None:
    """The vLLM venv's interpreter, or None when the venv has not been made."""
    python = vllm_venv() / "bin" / "python"
    return python if python.is_file() else None


def checkpoint_from_gguf(gguf_path: Path, cache_dir: Path, name: str | None = None) -> Path:
    """The checkpoint folder cache_dir/vllm-checkpoints/NAME made from `gguf_path` (converted once; vLLM 0.32
    cannot read GGUF). NAME defaults to the file's stem plus a digest of its path."""
    if name is None:
        digest = hashlib.sha256(str(gguf_path.resolve()).encode()).hexdigest()[:16]
        name = f"{gguf_path.stem}-{digest}"
    out = cache_dir / "vllm-checkpoints" / name
    python = vllm_python()
    if python is None:
        raise UserError.one(
            "the vLLM venv does not exist",
            path="engine.type",
            value="vllm",
            fix=f"run {SETUP_SCRIPT} (creates {vllm_venv()})",
        )
    if (out / "config.json").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [str(python), str(_CONVERTER), str(gguf_path), str(out)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-5:])
        raise UserError.one(
            f"converting {gguf_path} for vLLM failed:\n{tail}",
            path="model",
            fix="check that the GGUF file is a transformers-supported architecture",
        )
    return out
