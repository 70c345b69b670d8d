"""TGI is deprecated (archived upstream): still rendered, pinned; `validate` notes it without failing."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from llmdeploy.cli.main import cli
from llmdeploy.engines import get_engine

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def test_validate_notes_the_deprecation_and_passes() -> None:
    result = CliRunner().invoke(cli, ["validate", str(RECIPES / "tgi.yaml")])
    assert result.exit_code == 0, result.output
    note = next(line for line in result.output.splitlines() if "TGI is deprecated" in line)
    assert "note:" in note and "engine.type: sglang or vllm" in note and "3.1.0" in note


def test_other_engines_carry_no_deprecation_note() -> None:
    result = CliRunner().invoke(cli, ["validate", str(RECIPES / "sglang.yaml")])
    assert result.exit_code == 0, result.output
    assert "deprecated" not in result.output


def test_tgi_stays_pinned_to_its_catalogued_release() -> None:
    tgi = get_engine("tgi")
    assert tgi.image.endswith(":" + tgi.pinned_version)
    assert (
        Path(__file__).resolve().parents[2]
        / "llmdeploy/engines/catalogues"
        / tgi.catalogue_file(tgi.pinned_version)
    ).is_file()
