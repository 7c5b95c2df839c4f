"""Precision follows the device: ``bf16: auto`` is bf16 where the device runs it natively and fp32 elsewhere, the
engines' ``dtype: auto`` follows the actor, a set bf16 on a device that emulates it warns once with the measured
cost, and a config that cannot be settled is refused naming the key."""

import os
import subprocess

import pytest
import torch

from cli import train_ppo
from mindspeed_rl.accelerator import cpu as cpu_accelerator
from mindspeed_rl.accelerator import reset_accelerator
from mindspeed_rl.config_cls import ConfigError
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.features import load_ppo_config
from mindspeed_rl.features.precision import HostPrecision, settle_precision
from mindspeed_rl.models.builder import params_dtype
from mindspeed_rl.trainer.startup.plan import batch_plan
from mindspeed_rl.trainer.startup.precision import settle_run_precision
from tests.conftest import PYTHON, ROOT
from tests.helpers import assert_refused

NATIVE = HostPrecision(True, "this CPU runs bf16 natively: AVX512 with AMX")
AVX2 = HostPrecision(False, "this CPU has no native bf16: AVX2", bf16_slowdown=97.0)
# the environment that makes a bf16 CPU compute as an AVX2-only one does (ATen, oneDNN and MKL capped)
AVX2_ONLY = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


@pytest.mark.parametrize(
    "facts,native,why",
    [
        (("AVX512", True, ["AMX", "AVX512-BF16"]), True, "natively: AVX512 with AMX and AVX512-BF16"),
        (("AVX512", True, ["AVX512-BF16"]), True, "natively: AVX512 with AVX512-BF16"),
        (("AVX2", False, []), False, "no native bf16: AVX2"),
        (("AVX2", False, ["AVX512-BF16"]), False, "no native bf16: AVX2"),  # oneDNN capped (ONEDNN_MAX_CPU_ISA)
        (("AVX512", True, []), False, "no native bf16: AVX512 (oneDNN emulates bf16 on it)"),  # AVX-512, no BF16
    ],
)
def test_the_cpu_decision_with_the_capability_faked_both_ways(monkeypatch, facts, native, why):
    monkeypatch.setattr(cpu_accelerator, "cpu_bf16_facts", lambda: facts)
    monkeypatch.setattr(cpu_accelerator.platform, "machine", lambda: "x86_64")
    host = cpu_accelerator.CpuAccelerator().host_precision()
    assert host.native_bf16 is native and why in host.why, host


def test_auto_settles_to_the_device_answer_and_the_engines_follow_the_actor():
    for host, trained, dtype in ((NATIVE, "bf16", "bfloat16"), (AVX2, "fp32", "float32")):
        cfg = load_ppo_config("ppo_tiny_cpu")
        assert cfg.actor.megatron.bf16 == "auto" and cfg.generate.dtype == "auto"
        choice = settle_precision(cfg, host)
        assert (choice.trained, choice.engine_dtype, cfg.generate.dtype) == (trained, dtype, dtype)
        assert all(m.bf16 is (trained == "bf16") for m in (cfg.actor.megatron, cfg.critic.megatron))
        assert choice.warning is None
        assert choice.summary.startswith(f"{trained} (bf16: auto; {host.why}"), choice.summary
        assert f"  precision : {choice.summary}" in batch_plan(cfg)
        assert settle_precision(cfg, None) is choice  # settled once: a second call changes nothing


def test_a_set_bf16_runs_where_it_is_emulated_with_one_warning_of_its_measured_cost():
    cfg = load_ppo_config("ppo_tiny_cpu", ["megatron_training.bf16=true"])
    choice = settle_precision(cfg, AVX2)
    assert choice.trained == "bf16" and choice.engine_dtype == "bfloat16"
    assert choice.warning.startswith("warning: megatron_training.bf16 is true, but this CPU has no native bf16")
    assert "97x slower than fp32" in choice.warning and "97x slower" in choice.summary
    assert settle_precision(load_ppo_config("ppo_tiny_cpu", ["megatron_training.bf16=true"]), NATIVE).warning is None


def test_a_role_keeps_its_own_setting_and_a_set_dtype_is_kept():
    cfg = load_ppo_config("ppo_tiny_cpu", ["+critic_config.bf16=false", "generate_config.dtype=bfloat16"])
    choice = settle_precision(cfg, NATIVE)
    assert cfg.actor.megatron.bf16 is True and cfg.critic.megatron.bf16 is False
    assert choice.summary.startswith("actor bf16, critic fp32 (bf16: auto;"), choice.summary
    assert cfg.generate.dtype == "bfloat16" and "rollout engines bfloat16 (as set)" in choice.summary


def test_nothing_builds_a_model_from_an_unsettled_auto():
    with pytest.raises(ValueError, match="still auto"):
        params_dtype(MegatronConfig(model="tiny_qwen25", bf16="auto"))
    assert params_dtype(MegatronConfig(model="tiny_qwen25", bf16=False)) == torch.float32


def test_a_quantized_rollout_is_checked_against_the_settled_engine_dtype():
    cfg = load_ppo_config("ppo_tiny_cpu", ["generate_config.rollout_quantization=fp8"])  # refused only once settled
    with pytest.raises(ConfigError, match=r"generate_config.dtype: auto \(float32: the actor trains in fp32\)"):
        settle_precision(cfg, AVX2)
    assert settle_precision(load_ppo_config("ppo_tiny_cpu", ["generate_config.rollout_quantization=fp8"]), NATIVE)


def test_auto_beside_fp16_and_auto_on_a_device_that_is_not_here_exit_2_naming_the_key(capsys, monkeypatch):
    tiny = ["--config-name", "ppo_tiny_cpu", "dry_run=true"]
    assert_refused(tiny + ["megatron_training.fp16=true"], "actor_config.bf16", "auto together with fp16", capsys)
    monkeypatch.setenv("MINDSPEED_RL_DEVICE", "npu")
    reset_accelerator()
    try:
        assert_refused(tiny, "actor_config.bf16", "auto asks the device", capsys)
        # a set bf16 is not refused here: the device is checked when the run starts
        assert train_ppo.main(["--config-name", "ppo_qwen25_32b_A3", "dry_run=true"]) == 0
    finally:
        monkeypatch.delenv("MINDSPEED_RL_DEVICE")
        reset_accelerator()


@pytest.mark.parametrize(
    "facts,dtype,says",
    [
        (("AVX2", False, []), "auto", "Gated DeltaNet runs in bfloat16 only"),  # fp32 engines where bf16 is emulated
        (("AVX2", False, []), "bfloat16", "Gated DeltaNet kernel needs native bf16, and this CPU has no native bf16"),
        (("AVX512", True, ["AVX512-BF16"]), "float32", "generate_config.dtype bfloat16 keeps vLLM"),
        (("AVX512", True, ["AVX512-BF16"]), "bfloat16", None),  # vLLM runs it
    ],
)
def test_the_plan_says_what_a_family_whose_engine_kernels_need_bf16_does(monkeypatch, facts, dtype, says):
    if cpu_accelerator.compat_vllm.cpu_gated_deltanet_unavailable():
        pytest.skip(cpu_accelerator.compat_vllm.cpu_gated_deltanet_unavailable())
    monkeypatch.setattr(cpu_accelerator, "cpu_bf16_facts", lambda: facts)
    name = "tiny_qwen3_next"
    model = [f"megatron_training.model={name}", f"actor_config.model={name}", "megatron_training.bf16=auto"]
    cfg = load_ppo_config("grpo_tiny_cpu", model + [f"generate_config.dtype={dtype}"])
    choice = settle_run_precision(cfg)
    assert choice.trained == ("bf16" if facts[1] else "fp32"), choice
    if says is None:
        assert choice.rollout_note is None and "  kernels   :" not in batch_plan(cfg)
        return
    assert says in choice.rollout_note and "the megatron-core engine generates instead" in choice.rollout_note
    assert f"  kernels   : {choice.rollout_note}" in batch_plan(cfg)


def test_the_bf16_cost_probe_is_quick_and_measures():
    ratio = cpu_accelerator.matmul_slowdown(torch.float32)  # fp32 against itself
    assert 0.05 < ratio < 20, ratio


def dry_run_plan(env):
    proc = subprocess.run(
        [PYTHON, "cli/train_ppo.py", "--config-name", "ppo_tiny_cpu", "dry_run=true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    assert proc.returncode == 0, proc.stderr
    return next(line for line in proc.stdout.splitlines() if line.startswith("  precision :"))


def test_the_demo_config_trains_in_fp32_where_bf16_is_capped_and_follows_this_cpu_otherwise():
    """An AVX2-only host emulated (ATen and oneDNN capped: torch's own answer changes), and this host as it is."""
    assert dry_run_plan(AVX2_ONLY).startswith("  precision : fp32 (bf16: auto; this CPU has no native bf16: AVX2)")
    here = "bf16" if cpu_accelerator.CpuAccelerator().host_precision().native_bf16 else "fp32"
    assert dry_run_plan({}).startswith(f"  precision : {here} (bf16: auto;")
