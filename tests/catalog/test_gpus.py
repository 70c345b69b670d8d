import pytest

from llmdeploy.catalog.gpus import list_gpus, resolve_gpu
from llmdeploy.errors import UserError


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("H100", "H100-SXM"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("A100 40GB", "A100-40GB"),
        ("rtx 4090", "RTX-4090"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("l40s", "L40S"),
        ("A10G", "A10"),
        ("h200", "H200"),
        ("B200", "B200"),
        ("L4", "L4"),
        ("RTX_5090", "RTX-5090"),
        ("H100 PCIe", "H100-PCIe"),
    ],
)
def test_forgiving_names(name: str, expected: str) -> None:
    assert resolve_gpu(name).name == expected


def test_memory_is_what_cuda_reports_not_the_marketing_figure() -> None:
    for gpu in list_gpus():
        assert gpu.memory_gib < gpu.marketing_gb  # GiB as reported is always below the GB on the box
        assert gpu.memory_gib > 0.85 * gpu.marketing_gb * 1e9 / 2**30
        assert gpu.fp8_support == (gpu.fp8_tflops is not None)


def test_unknown_gpu_lists_names() -> None:
    with pytest.raises(UserError) as e:
        resolve_gpu("V100")
    assert "unknown GPU 'V100'" in str(e.value) and "H100-SXM" in str(e.value)


@pytest.mark.parametrize("name", ["A100", "nvidia a100", "A100_SXM4"])
def test_a_name_sold_in_two_sizes_is_refused_with_the_choices(name: str) -> None:
    with pytest.raises(UserError) as e:
        resolve_gpu(name)
    text = str(e.value)
    assert "ambiguous" in text and "A100-40GB" in text and "A100-80GB" in text
    assert e.value.problems[0].path == "hardware.gpu"
