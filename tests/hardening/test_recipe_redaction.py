"""No error, log or rendered file shows a secret: a value written into a secret-bearing field
(`server.api_key`, `server.hf_token`, a credential in `engine.env`), given with `--set`, or
interpolated from a variable named like a credential. Such values show as `'<redacted, N chars>'`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hardening.cli_run import run_cli

SECRET = "sk-live-0123456789abcdefABC"  # 27 characters
REDACTED = "<redacted, 27 chars>"
QUICKSTART = Path(__file__).resolve().parents[2] / "recipes" / "quickstart.yaml"


def _recipe(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "r.yaml"
    path.write_text(f"extends: {QUICKSTART}\n{body}")
    return path


def _assert_hidden(output: str) -> None:
    assert SECRET not in output
    assert "Traceback" not in output


@pytest.mark.parametrize(
    "body",
    [
        'server:\n  api_key: "${VLLM_API_KEY}"\n',  # the repro: inline where a mapping belongs
        "server:\n  api_key: {env: '${VLLM_API_KEY}'}\n",
        'server:\n  hf_token: "${HF_TOKEN}"\n',
        "limits:\n  max_model_len: ${MY_SERVICE_TOKEN}\n",  # a wrongly typed field holding one
        "model:\n  revision: ${OPENAI_API_KEY}\n",  # a well-typed field: would reach launch.sh
        "engine:\n  env: {HF_TOKEN: '${HF_TOKEN}'}\n",
        f"server:\n  api_key: {SECRET}\n",
        f"server:\n  api_key: {{env: {SECRET}}}\n",
        f"server:\n  hf_token: {{secret: {{name: {SECRET}}}}}\n",
        f"engine:\n  env: {{WANDB_API_KEY: {SECRET}}}\n",
    ],
)
def test_validate_and_render_never_print_the_secret(tmp_path: Path, body: str) -> None:
    env = {name: SECRET for name in ("VLLM_API_KEY", "HF_TOKEN", "MY_SERVICE_TOKEN", "OPENAI_API_KEY")}
    recipe = _recipe(tmp_path, body)
    out = tmp_path / "out"
    for args in (
        ("validate", str(recipe)),
        ("validate", "--output", "json", str(recipe)),
        ("render", str(recipe), "-o", str(out)),
        ("plan", str(recipe)),
    ):
        result = run_cli(*args, env=env)
        _assert_hidden(result.output)
        assert result.returncode == 2, result.output
    assert not out.exists() or all(SECRET not in f.read_text() for f in out.rglob("*") if f.is_file())


def test_inline_key_shows_its_length_only(tmp_path: Path) -> None:
    result = run_cli("validate", str(_recipe(tmp_path, f"server:\n  api_key: {SECRET}\n")))
    assert f"server.api_key: does not match any accepted form ({{env}} or {{secret}}) (got '{REDACTED}')" in (
        result.output
    )


def test_interpolated_credential_names_the_variable_not_its_value(tmp_path: Path) -> None:
    recipe = _recipe(tmp_path, 'server:\n  api_key: "${VLLM_API_KEY}"\n')
    result = run_cli("validate", "--output", "json", str(recipe), env={"VLLM_API_KEY": SECRET})
    problems = json.loads(result.output)["files"][0]["problems"]
    assert [p["path"] for p in problems] == ["server.api_key"]
    assert "${VLLM_API_KEY} looks like a credential" in problems[0]["message"]
    assert "server.api_key: {env: VLLM_API_KEY}" in problems[0]["fix"]


@pytest.mark.parametrize(
    "item",
    [f"server.api_key={SECRET}", f"server.api_key.env={SECRET}", f"server={{api_key: {SECRET}}}"],
)
def test_set_value_is_redacted(tmp_path: Path, item: str) -> None:
    result = run_cli("validate", str(QUICKSTART), "--set", item)
    _assert_hidden(result.output)
    assert result.returncode == 2
    assert REDACTED in result.output


def test_ordinary_values_are_still_shown(tmp_path: Path) -> None:
    # redaction is for secrets only: a wrong port or an unset ordinary variable keeps its value
    result = run_cli("validate", str(QUICKSTART), "--set", "server.port=99999")
    assert "(got 99999)" in result.output
