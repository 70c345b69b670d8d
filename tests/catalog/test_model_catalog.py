"""Catalog facts: exact parameter counts against published figures, the split, and resolution."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from llmdeploy.catalog.model_spec import weights_bytes
from llmdeploy.catalog.models import find_in_catalog, infer_quantization, list_models, resolve_model
from llmdeploy.errors import UserError
from llmdeploy.recipe.schema import ModelSection

# Exact counts published on model cards / safetensors metadata (tied embeddings counted once).
PUBLISHED = {
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-405B": 405_853_388_800,
    "meta-llama/Llama-3.2-1B": 1_235_814_400,
    "meta-llama/Llama-3.2-3B": 3_212_749_824,
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "mistralai/Mistral-7B-v0.1": 7_241_732_096,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "mistralai/Mistral-Small-24B-Base-2501": 23_572_403_200,
    "Qwen/Qwen2.5-0.5B": 494_032_768,
    "Qwen/Qwen2.5-1.5B": 1_543_714_304,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-14B": 14_770_033_664,
    "Qwen/Qwen2.5-32B": 32_763_876_352,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,
    "Qwen/Qwen1.5-MoE-A2.7B": 14_315_784_192,
    "google/gemma-2b": 2_506_172_416,
    "google/gemma-7b": 8_537_680_896,
    "google/gemma-2-2b": 2_614_341_888,
    "google/gemma-2-9b": 9_241_705_984,
    "google/gemma-2-27b": 27_227_128_320,
    "google/gemma-3-1b-pt": 999_885_952,
    "google/gemma-3-4b-pt": 4_300_079_472,
    "microsoft/phi-2": 2_779_683_840,
    "microsoft/Phi-3-mini-4k-instruct": 3_821_079_552,
    "microsoft/phi-4": 14_659_507_200,
    "openai/gpt-oss-20b": 20_914_757_184,
    "openai/gpt-oss-120b": 116_829_156_672,
    "HuggingFaceTB/SmolLM2-135M": 134_515_008,
    "HuggingFaceTB/SmolLM2-360M": 361_821_120,
    "HuggingFaceTB/SmolLM2-1.7B": 1_711_376_384,
}
# Families added from their config.json files, counted by transformers' own modelling code on the
# meta device (the counts the model cards round to 24B, 30.5B, 235B, 80B, 109B and 402B; MTP layers
# are not part of the model transformers builds). Config sources: Mistral-Small-3.1's config.json as
# transcribed in public test fixtures (text and Pixtral tower), the 2507 configs (262,144 positions,
# rope_theta 1e7 / 5e6), Qwen3-Next-80B-A3B-Instruct's (with the 48 layers and 151,936 vocabulary
# of the release), Llama-4-Scout's and -Maverick's (text, vision tower, interleave step 2 and 128
# experts for Maverick).
PUBLISHED.update(
    {
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503": 24_011_361_280,
        "Qwen/Qwen3-30B-A3B-Instruct-2507": 30_532_122_624,
        "Qwen/Qwen3-235B-A22B-Instruct-2507": 235_093_634_560,
        "Qwen/Qwen3-Next-80B-A3B-Instruct": 79_674_391_296,
        "meta-llama/Llama-4-Scout-17B-16E-Instruct": 108_641_793_536,
        "meta-llama/Llama-4-Maverick-17B-128E-Instruct": 401_583_781_376,
    }
)


@pytest.mark.parametrize(("hf_id", "count"), sorted(PUBLISHED.items()))
def test_parameter_count_matches_published(hf_id: str, count: int) -> None:
    assert resolve_model(hf_id).num_params == count


def test_deepseek_v3_is_671b_without_the_mtp_layer() -> None:
    spec = resolve_model("deepseek-ai/DeepSeek-V3")
    assert abs(spec.num_params - 671_026_419_712) / 671e9 < 1e-6
    assert 37.0e9 < spec.params.active_layers + spec.params.embedding + spec.params.head < 37.8e9


def test_every_family_of_the_issue_is_present() -> None:
    families = {s.family for s in list_models()}
    for family in (
        "llama-2",
        "llama-3",
        "llama-3.1",
        "llama-3.2",
        "llama-3.3",
        "codellama",
        "mistral",
        "mixtral",
        "mistral-small",
        "qwen1.5-moe",
        "qwen2",
        "qwen2.5",
        "qwen3",
        "qwen3-moe",
        "gemma",
        "gemma-2",
        "gemma-3",
        "qwen3-2507",
        "phi-2",
        "phi-3",
        "phi-4",
        "granite-3",
        "deepseek-v3",
        "deepseek-r1",
        "gpt-oss",
        "smollm2",
        "mistral-small-3.1",
        "qwen3-next",
        "llama-4",
    ):
        assert family in families, family


@pytest.mark.parametrize("spec", list_models(), ids=lambda s: s.hf_id)
def test_split_adds_up_and_shapes_are_sane(spec) -> None:  # type: ignore[no-untyped-def]
    p = spec.params
    assert p.embedding + p.layers + p.head + p.extra == spec.num_params
    assert 0 < p.linear < p.layers
    assert spec.num_attention_heads % spec.num_kv_heads == 0
    assert p.head == (spec.hidden_size * (2 if spec.norm_type == "layernorm" else 1)) + (
        0 if spec.tie_word_embeddings else p.embedding
    ) + (spec.vocab_size if spec.lm_head_bias else 0)
    assert len(spec.kinds) == spec.num_layers


def test_vision_towers_are_counted_from_their_config() -> None:
    # SigLIP without its pooling head + Gemma 3's projector; the 4B's safetensors total is published
    gemma = resolve_model("google/gemma-3-4b-it")
    assert gemma.params.extra == 416_866_032 + 1152 + 1152 * 2560
    # Pixtral (24 layers of 4 x 1024^2 + 3 x 1024 x 4096 + 2 norms) + Mistral 3's patch-merger projector
    pixtral = 3 * 14 * 14 * 1024 + 1024 + 24 * (4 * 1024**2 + 3 * 1024 * 4096 + 2 * 1024)
    projector = 1024 + 4 * 1024 * 1024 + 1024 * 5120 + 5120 * 5120
    assert resolve_model("mistralai/Mistral-Small-3.1-24B-Instruct-2503").params.extra == pixtral + projector
    scout, maverick = (
        resolve_model(f"meta-llama/Llama-4-{m}-Instruct") for m in ("Scout-17B-16E", "Maverick-17B-128E")
    )
    assert scout.params.extra == maverick.params.extra == 871_932_416


def test_gated_delta_net_layer_matches_the_release_shapes() -> None:
    # one Qwen3-Next decoder layer with a Gated DeltaNet and 512 experts: 1,648,531,648 parameters
    # as torchinfo prints it for the release's per-layer shapes
    spec = resolve_model("Qwen/Qwen3-Next-80B-A3B-Instruct")
    assert spec.kinds[:4] == ("linear", "linear", "linear", "full") and spec.kinds.count("linear") == 36
    full_layer = 2048 * (4096 + 4096) + 2 * 2048 * 512 + 4096 * 2048 + 2 * 256  # gated q, k, v, o, q/k norms
    moe = (
        512 * 3 * 2048 * 512 + 2048 * 512 + 3 * 2048 * 512 + 2048 + 2 * 2048
    )  # + router, shared, gate, norms
    per_linear = (spec.params.layers - 12 * (full_layer + moe)) // 36
    assert per_linear == 1_648_531_648


def test_llama4_maverick_alternates_dense_and_moe_layers() -> None:
    maverick = resolve_model("meta-llama/Llama-4-Maverick-17B-128E-Instruct")
    assert [maverick.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert (
        maverick.num_moe_layers == 24
        and resolve_model("meta-llama/Llama-4-Scout-17B-16E").num_moe_layers == 48
    )
    assert (
        maverick.kinds[:4] == ("chunked", "chunked", "chunked", "full")
        and maverick.attention_chunk_size == 8192
    )


def test_hybrid_patterns() -> None:
    gemma3 = resolve_model("google/gemma-3-27b-it")
    assert gemma3.kinds[:6] == ("sliding",) * 5 + ("full",)
    assert gemma3.is_hybrid and gemma3.kinds.count("full") == 10
    assert resolve_model("openai/gpt-oss-20b").kinds[:2] == ("sliding", "full")
    mistral = resolve_model("mistralai/Mistral-7B-v0.1")
    assert mistral.sliding_window == 4096 and not mistral.is_hybrid


@pytest.mark.parametrize(
    ("name", "base"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
        ("META-LLAMA/meta-llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B"),
        ("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4", "meta-llama/Llama-3.1-8B"),
        ("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4", "Qwen/Qwen2.5-7B"),
        ("neuralmagic/Meta-Llama-3.1-70B-Instruct-FP8", "meta-llama/Llama-3.1-70B"),
        ("google/gemma-2-9b-it", "google/gemma-2-9b"),
        ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"),
        ("Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
    ],
)
def test_derivatives_resolve_to_their_base(name: str, base: str) -> None:
    spec = resolve_model(name)
    assert spec.num_params == resolve_model(base).num_params
    assert spec.hf_id == name


def test_infer_quantization_from_name() -> None:
    assert infer_quantization("Qwen/Qwen2.5-7B-Instruct-GPTQ-Int4") == "gptq"
    assert infer_quantization("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4") == "awq"
    assert infer_quantization("neuralmagic/Meta-Llama-3.1-8B-Instruct-FP8") == "fp8"
    assert infer_quantization("meta-llama/Llama-3.1-8B-Instruct") is None


def test_architecture_field_names_the_base() -> None:
    spec = resolve_model(ModelSection(id="someone/my-finetune", architecture="Qwen/Qwen2.5-0.5B"))
    assert spec.hf_id == "someone/my-finetune" and spec.num_params == 494_032_768


def test_unknown_model_is_an_error_not_a_guess() -> None:
    with pytest.raises(UserError) as e:
        resolve_model("acme/totally-new-model-7B")
    text = str(e.value)
    assert "unknown model 'acme/totally-new-model-7B'" in text and "model.architecture" in text


def _write_safetensors(path: Path, tensors: dict[str, list[int]]) -> None:
    header, offset = {}, 0
    for name, shape in tensors.items():
        n = 1
        for d in shape:
            n *= d
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + 2 * n]}
        offset += 2 * n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)  # header only: sizes come from it


def test_local_config_folder_with_safetensors_header(tmp_path: Path) -> None:
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "vocab_size": 151936,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16",
        "sliding_window": 32768,
        "use_sliding_window": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = resolve_model(ModelSection(id="local/qwen", path=str(tmp_path)))
    assert spec.num_params == 494_032_768 and spec.sliding_window is None and spec.source == "config"
    _write_safetensors(tmp_path / "model.safetensors", {"a": [494_032_768 // 4, 4], "vision.x": [10]})
    spec = resolve_model(ModelSection(id="local/qwen", path=str(tmp_path)))
    assert spec.num_params == 494_032_778 and spec.params.extra == 10
    assert spec.weights_bytes_on_disk == 2 * 494_032_778


def test_weights_bytes_keeps_embeddings_16bit() -> None:
    spec = resolve_model("meta-llama/Llama-3.1-8B")
    int4 = weights_bytes(spec, 4.0)
    embeddings = (spec.params.embedding + spec.params.head) * 2
    assert int4 > embeddings + spec.params.linear * 0.5
    assert weights_bytes(spec, 16.0) == spec.num_params * 2


def test_find_in_catalog_none_for_unknown() -> None:
    assert find_in_catalog("nothing/here") is None


def test_qwen3_2507_and_gemma3_rope_facts() -> None:
    new = resolve_model("Qwen/Qwen3-4B-Instruct-2507")
    old = resolve_model("Qwen/Qwen3-4B")
    assert new.hf_id == "Qwen/Qwen3-4B-Instruct-2507" and new.num_params == old.num_params
    assert (new.max_position_embeddings, new.rope_theta) == (262144, 5000000.0)
    assert old.max_position_embeddings == 40960
    for name in ("google/gemma-3-1b-it", "google/gemma-3-27b-it"):
        spec = resolve_model(name)
        assert (spec.rope_theta, spec.rope_local_base_freq) == (1000000.0, 10000.0)
    assert resolve_model("google/gemma-7b-it").num_params == 8_537_680_896
