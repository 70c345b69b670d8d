"""Issue 48's recipe inputs: `--set` values under the recipe file's limits, YAML core tags with
values they cannot hold, damaged model files, GPU-less or drain-cutting Kubernetes renders,
credentials in `${VAR}` whatever the variable's name, ambiguous GPU names, typos in model ids,
`render -o -` and hard links in the output folder. Each is a located `UserError` (exit 2) in well
under the 5 s a case may take, never a traceback, and no secret value is ever shown."""

from __future__ import annotations

import json
import os
import signal
import stat
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import pytest
import yaml

from hardening.cli_run import CliResult, run_cli
from llmdeploy.recipe import load_recipe

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
QUICKSTART = RECIPES / "quickstart.yaml"
PRODUCTION = RECIPES / "production.yaml"
BOUND_S = 5.0
# 266 characters (the took 338): eight levels of nine aliases, 9^8 values once expanded
ALIAS_BOMB = (
    '[&a ["x","x","x","x","x","x","x","x","x"],&b [*a,*a,*a,*a,*a,*a,*a,*a,*a],'
    "&c [*b,*b,*b,*b,*b,*b,*b,*b,*b],&d [*c,*c,*c,*c,*c,*c,*c,*c,*c],&e [*d,*d,*d,*d,*d,*d,*d,*d,*d],"
    "&f [*e,*e,*e,*e,*e,*e,*e,*e,*e],&g [*f,*f,*f,*f,*f,*f,*f,*f,*f],&h [*g,*g,*g,*g,*g,*g,*g,*g,*g]]"
)


@contextmanager
def _within(seconds: float) -> Iterator[None]:
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise AssertionError(f"took over {seconds} s")

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _refused(*args: str, env: dict[str, str] | None = None) -> CliResult:
    with _within(BOUND_S):
        result = run_cli(*args, env=env)
    assert "Traceback" not in result.output, result.output
    assert result.returncode == 2, f"{result.args}: {result.output}"
    return result


# --- item 7: --set values and YAML tags ----------------------------------------------------------


@pytest.mark.parametrize(
    ("item", "field"),
    [
        ("limits.max_model_len=!!int x", "limits.max_model_len"),
        ("limits.kv_cache_memory_gib=!!float abc", "limits.kv_cache_memory_gib"),
        ("kv_cache.enable_prefix_caching=!!bool maybe", "kv_cache.enable_prefix_caching"),
        ("description=!!timestamp notadate", "description"),
        ("limits.max_model_len=!!int " + "9" * 5000, "limits.max_model_len"),
    ],
)
def test_a_core_tag_with_a_value_it_cannot_hold_is_located(item: str, field: str) -> None:
    result = _refused("validate", str(QUICKSTART), "--set", item)
    assert f"--set {item[:40]}" in result.output and f"{field}:" in result.output
    assert "remove the `!!` tag" in result.output


def test_a_core_tag_in_a_recipe_file_names_its_line(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {QUICKSTART}\nlimits:\n  max_model_len: !!int x\n")
    result = _refused("validate", str(recipe))
    assert f"{recipe}:3: limits.max_model_len:" in result.output


@pytest.mark.parametrize(
    "value",
    ["[" * 5000 + "]" * 5000, "{a: " * 5000 + "1" + "}" * 5000, "[" * 300 + "]" * 300, ALIAS_BOMB],
    ids=["list-5000-deep", "mapping-5000-deep", "list-300-deep", "alias-bomb-338-chars"],
)
def test_set_values_get_the_recipe_files_limits(value: str) -> None:
    result = _refused("validate", str(QUICKSTART), "--set", f"engine.extra_args={value}")
    assert "engine.extra_args" in result.output
    assert "nested more than" in result.output or "expands to more than" in result.output
    assert len(result.output) < 5000  # the value is shortened where the item is named


@pytest.mark.parametrize(
    "text", [ALIAS_BOMB, "a: &a [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]\nb: [" + "*a, " * 2100 + "1]"]
)
def test_an_alias_bomb_is_refused_before_any_value_is_built(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted over the composed graph: refusing took ~0.5 s of building 20,000 values before, which a
    busy host stretched past the fuzzer's 5 s bound."""
    from llmdeploy.recipe import yaml_source

    def no_build(*args: object) -> None:
        raise AssertionError("values were built")

    monkeypatch.setattr(yaml_source._Builder, "build", no_build)
    parsed = yaml_source.parse_yaml(text, "bomb.yaml")
    assert [p.message for p in parsed.problems] == [yaml_source._TOO_MANY_VALUES]
    assert parsed.problems[0].line == 1


def test_set_items_longer_than_a_recipe_file_may_be_are_refused() -> None:
    result = _refused("validate", str(QUICKSTART), "--set", "description=" + "x" * (1024 * 1024 + 1))
    assert "longer than 1024 KiB" in result.output


def test_a_set_path_deeper_than_any_field_is_refused() -> None:
    result = _refused("validate", str(QUICKSTART), "--set", ".".join(["a"] * 5000) + "=1")
    assert "fields deep" in result.output


def test_a_set_value_that_is_no_yaml_stays_text() -> None:
    recipe = load_recipe(QUICKSTART, ["description=a: [b"])
    assert recipe.description == "a: [b"


# --- item 8: model files -------------------------------------------------------------------------


def _folder(tmp_path: Path, **changes: object) -> Path:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "vocab_size": 49152,
        "max_position_embeddings": 8192,
    }
    config.update(changes)
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"num_hidden_layers": "30"}, "num_hidden_layers must be a whole number (got '30')"),
        ({"num_hidden_layers": 10**12}, "num_hidden_layers must be between 1 and 10,000"),
        ({"hidden_size": [576]}, "hidden_size must be a whole number"),
        ({"num_attention_heads": 0}, "num_attention_heads must be between 1"),
        ({"rope_theta": "fast"}, "rope_theta must be a finite number"),
        ({"layer_types": ["full_attention"] * 3}, "layer_types must list one layer type"),
        ({"text_config": 7}, "text_config must be a JSON object"),
    ],
)
def test_a_damaged_config_json_names_the_key(
    tmp_path: Path, changes: dict[str, object], expected: str
) -> None:
    folder = _folder(tmp_path, **changes)
    model = [f"--set=model.path={folder}", "--set=model.pypi=null", "--set=model.quantization=none"]
    for args in (("models", "show", str(folder)), ("validate", str(QUICKSTART), *model)):
        result = _refused(*args)
        assert expected in result.output and "fix:" in result.output


def test_a_cut_config_json_names_file_and_line(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    text = (folder / "config.json").read_text()
    (folder / "config.json").write_text(text[: len(text) // 2])
    result = _refused("models", "show", str(folder))
    assert f"{folder / 'config.json'}:1: not valid JSON" in result.output


def test_a_safetensors_header_claiming_exabytes_is_refused(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")
    result = _refused("models", "show", str(folder))
    assert "safetensors header" in result.output and "more than the file" in result.output


def test_a_gguf_claiming_more_fields_than_it_holds_is_refused(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 1, 2**62) + b"\0" * 64)
    result = _refused("models", "show", str(gguf))
    assert "a field count of" in result.output and "corrupt header" in result.output


def test_the_engine_names_a_damaged_model_file(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from llmdeploy_engine.runner.setup import load_model_config

    folder = _folder(tmp_path, num_hidden_layers=[30], hidden_size=10**9)
    with pytest.raises(ValueError, match=r"wrong type|outside") as caught:
        load_model_config(str(folder))
    assert str(folder) in str(caught.value)


# --- item 9: Kubernetes pods, credentials in ${VAR}, hard links ----------------------------------


def test_a_multi_node_replica_without_a_gpu_per_pod_is_refused(tmp_path: Path) -> None:
    for command in ("validate", "render"):
        extra = ("-o", str(tmp_path / "out")) if command == "render" else ()
        result = _refused(command, str(PRODUCTION), "--set", "hardware.nodes=2", *extra)
        assert "hardware.nodes:" in result.output and "some pods would request no GPU" in result.output
    assert not (tmp_path / "out").exists()


def test_a_grace_period_shorter_than_the_drain_is_refused() -> None:
    from llmdeploy_engine.facts import DRAIN_TIMEOUT_S

    sets = ["--set=engine.type=builtin", "--set=hardware.device=cpu", "--set=model.quantization=none"]
    sets += ["--set=speculative=null", "--set=server.hf_token=null"]
    short = f"--set=target.termination_grace_period_s={DRAIN_TIMEOUT_S}"
    result = _refused("validate", str(PRODUCTION), *sets, short)
    assert "target.termination_grace_period_s:" in result.output
    assert f"at least {DRAIN_TIMEOUT_S + 5}" in result.output


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DATABASE_URL", "postgres://app:Hunter2-x9q@db.internal:5432/app"),
        ("GH_PAT", "ghp_" + "Q7x" * 12),
        ("SOME_SETTING", "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz"),
    ],
)
def test_an_interpolated_credential_is_refused_without_its_value(
    tmp_path: Path, name: str, value: str
) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"extends: {PRODUCTION}\nengine:\n  env:\n    X: ${{{name}}}\n")
    for command in ("validate", "render"):
        extra = ("-o", str(tmp_path / "out")) if command == "render" else ()
        result = _refused(command, str(recipe), *extra, env={name: value})
        assert f"${{{name}}}" in result.output and f"{recipe}:4" in result.output
        assert value not in result.output and value[6:20] not in result.output
    assert not (tmp_path / "out").exists()


def test_an_ordinary_variable_still_interpolates() -> None:
    recipe = load_recipe(QUICKSTART, env={"X": "1"})
    assert recipe.name == "quickstart"
    from llmdeploy.recipe.interpolation import interpolate

    data, problems = interpolate({"a": "${PLAIN_URL}"}, {}, {"PLAIN_URL": "https://example.test/v1"})
    assert data == {"a": "https://example.test/v1"} and not problems


def test_render_never_chmods_a_hard_link_to_a_file_outside(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = run_cli("render", str(QUICKSTART), "-o", str(out))
    assert first.returncode == 0, first.output
    outside = tmp_path / "outside.sh"
    outside.write_text((out / "launch.sh").read_text())  # same text: render would leave it unchanged
    outside.chmod(0o600)
    (out / "launch.sh").unlink()
    os.link(outside, out / "launch.sh")
    again = run_cli("render", str(QUICKSTART), "-o", str(out))
    assert again.returncode == 0, again.output
    assert stat.S_IMODE(outside.stat().st_mode) == 0o600
    assert os.stat(out / "launch.sh").st_ino != outside.stat().st_ino
    assert os.access(out / "launch.sh", os.X_OK)


# --- item 13: GPU names, model id typos, render to stdout ----------------------------------------


def test_an_ambiguous_gpu_is_refused_with_the_choices() -> None:
    result = _refused("validate", str(PRODUCTION), "--set", "hardware.gpu=A100")
    assert "hardware.gpu:" in result.output and "A100-40GB" in result.output and "A100-80GB" in result.output


@pytest.mark.parametrize(
    ("typo", "meant"),
    [
        ("SmolLM2-135M-Instrct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
        ("meta-llama/Llama-3.1-8B-Instuct", "meta-llama/Llama-3.1-8B-Instruct"),
    ],
)
def test_a_typo_in_model_id_gets_did_you_mean(typo: str, meant: str) -> None:
    result = _refused(
        "validate", str(PRODUCTION), "--set", f"model.id={typo}", env={"HF_ENDPOINT": "http://127.0.0.1:9"}
    )
    assert "model.id:" in result.output and f"did you mean {meant!r}" in result.output


def test_render_to_stdout_writes_one_yaml_stream(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = run_cli("render", str(PRODUCTION), "-o", "-")
    assert result.returncode == 0, result.output
    documents = [d for d in yaml.safe_load_all(result.output) if d is not None]
    kinds = {d["kind"] for d in documents}
    assert {"Deployment", "Service", "HorizontalPodAutoscaler"} <= kinds and "Kustomization" not in kinds
    assert "# Source: deployment.yaml" in result.output
    assert not (tmp_path / "-").exists()
    local = _refused("render", str(QUICKSTART), "-o", "-")
    assert "launch.sh" in local.output and "-o DIR" in local.output
    assert not (tmp_path / "-").exists()


# --- items 10 and 12: what the pods run and request ----------------------------------------------


def _pod_templates(*sets: str) -> list[dict[str, object]]:
    from llmdeploy.planner import make_plan
    from llmdeploy.targets import render

    recipe = load_recipe(PRODUCTION, list(sets))
    documents = render(recipe, make_plan(recipe)).documents
    assert "ConfigMap" not in {d["kind"] for d in documents}  # the recipe copy nothing read
    return [d["spec"]["template"] for d in documents if d["kind"] in ("Deployment", "LeaderWorkerSet")]


def test_bench_and_smoke_changes_leave_the_pod_templates_alone() -> None:
    changed = _pod_templates(
        "bench.num_requests=7", "bench.concurrency=[3]", "smoke.startup_timeout_s=999", "description=other"
    )
    assert changed == _pod_templates()
    assert changed != _pod_templates("limits.max_num_seqs=8")  # what the engine runs still counts


def test_pods_request_cpu_and_memory_and_mount_no_api_token() -> None:
    (template,) = _pod_templates()
    pod = template["spec"]
    assert isinstance(pod, dict)
    requests = pod["containers"][0]["resources"]["requests"]
    assert int(requests["cpu"]) >= 2 and int(requests["memory"].removesuffix("Gi")) >= 16  # 8B weights
    assert pod["automountServiceAccountToken"] is False
    (own,) = _pod_templates(
        "target.resources.requests.memory=64Gi", "target.automount_service_account_token=true"
    )
    pod = own["spec"]
    assert isinstance(pod, dict)
    assert pod["containers"][0]["resources"]["requests"]["memory"] == "64Gi"
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == requests["cpu"]
    assert pod["automountServiceAccountToken"] is True


def test_a_network_policy_is_rendered_only_when_asked() -> None:
    from llmdeploy.planner import make_plan
    from llmdeploy.targets import render

    assert "NetworkPolicy" not in {d["kind"] for d in render(load_recipe(PRODUCTION), None).documents}
    monitoring = "{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}}"
    recipe = load_recipe(PRODUCTION, [f"target.network_policy={{allow_from: [{monitoring}]}}"])
    (policy,) = [d for d in render(recipe, make_plan(recipe)).documents if d["kind"] == "NetworkPolicy"]
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == "production"
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": recipe.server.port}]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    default = load_recipe(PRODUCTION, ["target.network_policy={}"])
    (policy,) = [d for d in render(default, None).documents if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {}}]  # this namespace's pods only
    result = _refused("validate", str(PRODUCTION), "--set", "target.network_policy={allow_from: [{}]}")
    assert "target.network_policy.allow_from" in result.output


def test_validate_and_plan_say_what_the_cluster_needs() -> None:
    for command in ("validate", "plan"):
        result = run_cli(command, str(PRODUCTION))
        assert result.returncode == 0, result.output
        assert "ReadWriteMany" in result.output and "custom-metrics adapter" in result.output


def test_the_engine_refuses_a_gguf_header_its_file_cannot_hold(tmp_path: Path) -> None:
    """gguf-py trusts the header: a billion-item array in a small file took it minutes and GBs."""
    pytest.importorskip("torch")
    from llmdeploy_engine.runner.setup import load_model_config

    gguf = tmp_path / "m.gguf"
    key = b"general.architecture"
    field = struct.pack("<Q", len(key)) + key + struct.pack("<IIQ", 9, 10, 10**9)  # u64[1e9], no items
    gguf.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + field + b"\0" * 64)
    with _within(BOUND_S), pytest.raises(ValueError, match="more than the") as caught:
        load_model_config(str(gguf))
    assert str(gguf) in str(caught.value)
