"""The loader's layering: extends chains, ${ENV}, --set, defaults, and the digest."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmdeploy.errors import UserError
from llmdeploy.recipe import load_recipe, recipe_digest


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _problems(path: Path, **kw: object) -> str:
    with pytest.raises(UserError) as info:
        load_recipe(path, **kw)  # type: ignore[arg-type]
    return str(info.value)


BASE = """\
name: base-name
model:
  id: meta-llama/Llama-3.1-8B-Instruct
  path: weights/llama
limits:
  max_model_len: 8192
  max_num_seqs: 64
bench:
  concurrency: [1, 2, 4]
"""


def test_extends_deep_merges_mappings_and_replaces_lists(tmp_path: Path) -> None:
    _write(tmp_path, "base.yaml", BASE)
    child = _write(
        tmp_path,
        "child.yaml",
        "extends: base.yaml\nlimits:\n  max_num_seqs: 8\nbench:\n  concurrency: [16]\n",
    )
    recipe = load_recipe(child, env={})
    assert recipe.limits.max_model_len == 8192  # kept from the base
    assert recipe.limits.max_num_seqs == 8  # overridden
    assert recipe.bench.concurrency == [16]  # lists are replaced, not appended
    assert recipe.name == "child"  # the name is the leaf's, never inherited
    assert recipe.model.path == str(tmp_path / "weights" / "llama")  # relative to base.yaml's folder


def test_extends_chain_across_folders(tmp_path: Path) -> None:
    _write(tmp_path, "base.yaml", BASE)
    _write(tmp_path, "mid/mid.yaml", "extends: ../base.yaml\nkv_cache: {dtype: fp8}\n")
    leaf = _write(
        tmp_path, "leaf/leaf.yaml", "extends: ../mid/mid.yaml\nname: leaf-one\nlimits: {max_num_seqs: 2}\n"
    )
    recipe = load_recipe(leaf, env={})
    assert (recipe.name, recipe.kv_cache.dtype, recipe.limits.max_num_seqs) == ("leaf-one", "fp8", 2)
    assert recipe.limits.max_model_len == 8192


def test_extends_cycle_names_the_chain(tmp_path: Path) -> None:
    _write(tmp_path, "a.yaml", "extends: b.yaml\nmodel: {id: x}\n")
    _write(tmp_path, "b.yaml", "extends: c.yaml\n")
    _write(tmp_path, "c.yaml", "extends: a.yaml\n")
    text = _problems(tmp_path / "a.yaml", env={})
    assert "extends cycle:" in text and "a.yaml -> " in text and "b.yaml -> " in text and "c.yaml -> " in text


def test_extends_self_is_a_cycle(tmp_path: Path) -> None:
    path = _write(tmp_path, "self.yaml", "extends: self.yaml\nmodel: {id: x}\n")
    assert "extends cycle" in _problems(path, env={})


def test_env_interpolation_with_defaults_and_escape(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "env.yaml",
        "model:\n  id: ${MODEL_ID}\n  revision: ${REV:-main}\nserver:\n  port: ${PORT:-9000}\n"
        "engine:\n  env: {LITERAL: '$${NOT_A_VAR}', MIXED: 'a-${MODEL_ID}-b'}\n",
    )
    recipe = load_recipe(path, env={"MODEL_ID": "Qwen/Qwen2.5-7B-Instruct"})
    assert recipe.model.id == "Qwen/Qwen2.5-7B-Instruct"
    assert recipe.model.revision == "main"
    assert recipe.server.port == 9000
    assert recipe.engine.env == {"LITERAL": "${NOT_A_VAR}", "MIXED": "a-Qwen/Qwen2.5-7B-Instruct-b"}


def test_missing_env_variables_are_all_reported(tmp_path: Path) -> None:
    path = _write(tmp_path, "env.yaml", "model:\n  id: ${A_VAR}\n  revision: ${B_VAR}\n")
    text = _problems(path, env={})
    assert "env.yaml:2: model.id: environment variable A_VAR is not set" in text
    assert "env.yaml:3: model.revision: environment variable B_VAR is not set" in text


def test_malformed_reference(tmp_path: Path) -> None:
    path = _write(tmp_path, "env.yaml", "model:\n  id: ${not valid}\n")
    assert "'${not valid}' is not a variable reference" in _problems(path, env={})


def test_set_overrides_typed_values_and_new_sections(tmp_path: Path) -> None:
    path = _write(tmp_path, "base.yaml", BASE)
    recipe = load_recipe(
        path,
        overrides=[
            "limits.max_model_len=4096",
            "limits.gpu_memory_utilization=0.8",
            "bench.concurrency=[1, 8]",
            "speculative.method=ngram",
            "engine.env.HF_HOME=/cache",
            "kv_cache.prefix_caching=false",
        ],
        env={},
    )
    assert recipe.limits.max_model_len == 4096
    assert recipe.limits.gpu_memory_utilization == 0.8
    assert recipe.bench.concurrency == [1, 8]
    assert recipe.speculative is not None and recipe.speculative.method == "ngram"
    assert recipe.engine.env == {"HF_HOME": "/cache"}
    assert recipe.kv_cache.prefix_caching is False


def test_set_unknown_path_is_reported_like_an_unknown_key(tmp_path: Path) -> None:
    path = _write(tmp_path, "base.yaml", BASE)
    text = _problems(path, overrides=["limits.max_model_lenx=4", "limits.max_num_seqs=many"], env={})
    assert "--set limits.max_model_lenx=4: limits.max_model_lenx: unknown field 'max_model_lenx'" in text
    assert "did you mean 'max_model_len'?" in text
    assert "--set limits.max_num_seqs=many: limits.max_num_seqs: input should be a valid integer" in text


def test_set_malformed_items(tmp_path: Path) -> None:
    path = _write(tmp_path, "base.yaml", BASE)
    text = _problems(
        path, overrides=["limits", "=3", "limits.max_model_len.deeper=1", "bench.concurrency.7=1"], env={}
    )
    assert "--set limits: expected PATH=VALUE" in text
    assert "--set =3: expected PATH=VALUE" in text
    assert "limits.max_model_len is a value, not a section" in text
    assert "bench.concurrency is a list of 3 item(s); 7 is not one of its indexes" in text


def test_set_list_index(tmp_path: Path) -> None:
    path = _write(tmp_path, "base.yaml", BASE)
    assert load_recipe(path, overrides=["bench.concurrency.1=32"], env={}).bench.concurrency == [1, 32, 4]


def test_name_defaults_to_a_dns_label_from_the_file_stem(tmp_path: Path) -> None:
    path = _write(tmp_path, "My_Long.Context.yaml", "model: {id: x}\n")
    assert load_recipe(path, env={}).name == "my-long-context"


def test_absolute_model_path_is_kept(tmp_path: Path) -> None:
    path = _write(tmp_path, "abs.yaml", "model: {id: x, path: /models/x.gguf}\n")
    assert load_recipe(path, env={}).model.path == "/models/x.gguf"


def test_anchors_merge_keys_and_x_keys(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "anchors.yaml",
        "x-common: &common\n  id: meta-llama/Llama-3.1-8B-Instruct\n  dtype: float16\n"
        "model:\n  <<: *common\n  dtype: bfloat16\n",
    )
    recipe = load_recipe(path, env={})
    assert (recipe.model.id, recipe.model.dtype) == ("meta-llama/Llama-3.1-8B-Instruct", "bfloat16")


def test_recursive_alias_is_an_error_not_a_hang(tmp_path: Path) -> None:
    path = _write(tmp_path, "rec.yaml", "model: &m\n  id: x\n  self: *m\n")
    assert "recursive alias" in _problems(path, env={})


def test_non_string_keys_and_unsupported_tags(tmp_path: Path) -> None:
    path = _write(tmp_path, "keys.yaml", "model: {id: x}\nengine:\n  env:\n    1: one\n")
    assert "key '1' is read as int, not a name" in _problems(path, env={})
    path = _write(tmp_path, "tag.yaml", "model: !!python/object:os.system {id: x}\n")
    assert "unsupported YAML tag" in _problems(path, env={})


def test_unreadable_inputs(tmp_path: Path) -> None:
    assert "recipe file not found" in _problems(tmp_path / "nope.yaml", env={})
    assert "is a folder" in _problems(tmp_path, env={})
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"model: {id: caf\xe9}\n")
    assert "not UTF-8 text" in _problems(path, env={})
    path = _write(tmp_path, "scalar.yaml", "just a string\n")
    assert "this file is a single value" in _problems(path, env={})


def test_digest_is_stable_and_sensitive(tmp_path: Path) -> None:
    a = _write(
        tmp_path, "a.yaml", "name: same\nmodel: {id: x}\nlimits: {max_num_seqs: 4, max_model_len: 8}\n"
    )
    b = _write(
        tmp_path, "b.yaml", "name: same\nlimits: {max_model_len: 8, max_num_seqs: 4}\nmodel: {id: x}\n"
    )
    digest = recipe_digest(load_recipe(a, env={}))
    assert len(digest) == 64
    assert digest == recipe_digest(load_recipe(b, env={}))  # key order does not matter
    assert digest != recipe_digest(load_recipe(a, overrides=["limits.max_num_seqs=5"], env={}))


def test_recipe_is_frozen(tmp_path: Path) -> None:
    recipe = load_recipe(_write(tmp_path, "a.yaml", "model: {id: x}\n"), env={})
    with pytest.raises(Exception, match="frozen"):
        recipe.limits.max_num_seqs = 3  # type: ignore[misc]


def test_merged_values_point_at_the_anchor_and_own_keys_win(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "mk.yaml",
        "x-base: &b\n  id: x\n  dtype: fp16\n  revision: 3\nmodel:\n  <<: *b\n  quantization: q\n  revision: 4\n",
    )
    text = _problems(path, env={})
    assert "mk.yaml:3: model.dtype: not an allowed value (got 'fp16')" in text
    assert "mk.yaml:7: model.quantization: not an allowed value (got 'q')" in text
    assert "mk.yaml:8: model.revision: input should be a valid string (got 4)" in text


def test_problems_in_a_base_recipe_name_the_base_file(tmp_path: Path) -> None:
    _write(tmp_path, "base.yaml", "model:\n  id: x\n  dtype: fp16\n")
    child = _write(tmp_path, "child.yaml", "extends: base.yaml\nlimits:\n  max_num_seqs: 0\n")
    text = _problems(child, env={})
    assert "base.yaml:3: model.dtype: not an allowed value" in text
    assert "child.yaml:3: limits.max_num_seqs: input should be greater than or equal to 1 (got 0)" in text
