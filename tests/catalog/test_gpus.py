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
        resolve_gpu("P100")
    assert "unknown GPU 'P100'" in str(e.value) and "H100-SXM" in str(e.value)


def test_catalog_covers_the_gpus_users_run_with_the_driver_total_or_a_note() -> None:
    # issue 44: each with memory as the driver reports it (nvidia-smi's total, with the public output
    # that shows it), or a note saying how its figure was inferred where no driver total is on record
    from llmdeploy.catalog.gpus import list_gpus

    for name in (
        "T4", "V100-16GB", "V100-32GB", "A10G", "A40", "RTX A6000", "RTX 6000 Ada", "L40",
        "RTX PRO 4000 Blackwell", "RTX PRO 6000 Blackwell", "H20", "GH200", "H100 NVL", "B300",
        "MI300X", "MI325X",
    ):  # fmt: skip
        resolve_gpu(name)
    for gpu in list_gpus():
        assert gpu.memory_gib > 0
        if gpu.driver_total_mib is not None:
            assert gpu.driver_source and gpu.driver_source.startswith("https://"), gpu.name
            assert gpu.memory_gib * 1024 < gpu.driver_total_mib, gpu.name  # CUDA's total is below it
        else:
            assert gpu.memory_note or gpu.name in ("H100-PCIe", "H200", "B200"), gpu.name
    assert {g.vendor for g in list_gpus()} == {"nvidia", "amd"}


def test_rocm_gpus_are_refused_with_a_located_error() -> None:
    from llmdeploy.catalog.models import resolve_model
    from llmdeploy.memory.plan_inputs import PlanInputs
    from llmdeploy.planner.plan import plan_for

    with pytest.raises(UserError) as e:
        plan_for(PlanInputs(spec=resolve_model("Qwen/Qwen2.5-7B"), gpu=resolve_gpu("MI300X")))
    problem = e.value.problems[0]
    assert problem.path == "hardware.gpu" and "ROCm" in problem.message
    assert problem.fix and "--gpu-memory-gib" in problem.fix


@pytest.mark.parametrize("name", ["A100", "nvidia a100", "A100_SXM4", "V100", "Tesla V100"])
def test_a_name_sold_in_two_sizes_is_refused_with_the_choices(name: str) -> None:
    with pytest.raises(UserError) as e:
        resolve_gpu(name)
    text = str(e.value)
    assert "ambiguous" in text
    assert ("A100-40GB" in text and "A100-80GB" in text) or ("V100-16GB" in text and "V100-32GB" in text)
    assert e.value.problems[0].path == "hardware.gpu"
