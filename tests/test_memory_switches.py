"""Recomputation and MindSpeed's memory switches: the keys' refusals, the device's (CPU refuses what only MindSpeed
implements), the flags MindSpeed is handed on NPU, and the activation memory each recomputation setting keeps
(bench/recompute_memory.py's count, on a tiny model). That the recomputed steps equal the plain one is in
tests/test_engine.py."""

import sys

import pytest
import torch

from bench.recompute_memory import SETTINGS, measure
from mindspeed_rl.accelerator import get_accelerator
from mindspeed_rl.accelerator.cpu import CpuAccelerator
from mindspeed_rl.accelerator.npu import NpuAccelerator
from mindspeed_rl.config_cls.megatron_config import mindspeed_argv
from mindspeed_rl.features import load_ppo_config, preflight
from mindspeed_rl.models.builder import recompute_fields
from mindspeed_rl.utils.cli import UserError
from tests.helpers import assert_refused, single_process_world_fixture, tiny_model_config, tiny_role

single_process_world = single_process_world_fixture()


@pytest.mark.parametrize(
    "overrides, key, text",
    [
        (["+actor_config.recompute_modules=[mlp]"], "actor_config.recompute_modules", "needs recompute_granularity"),
        (
            ["actor_config.recompute_granularity=selective", "+actor_config.recompute_modules=[attention]"],
            "actor_config.recompute_modules",
            "choose among core_attn, layernorm, mlp, moe",
        ),
        (
            ["actor_config.recompute_granularity=selective", "+actor_config.recompute_modules=[moe]"],
            "actor_config.recompute_modules",
            "no experts",
        ),
        (
            ["actor_config.recompute_granularity=full", "+actor_config.recompute_norm=true"],
            "actor_config.recompute_norm",
            "recomputed already",
        ),
        (["+actor_config.recompute_norm_num_layers=2"], "actor_config.recompute_norm_num_layers", "is false"),
        (["+actor_config.reuse_fp32_param=true", "actor_config.bf16=false"], "actor_config.reuse_fp32_param", "bf16"),
        (["+actor_config.swap_optimizer=true"], "actor_config.swap_optimizer", "use_distributed_optimizer"),
        (["+actor_config.moe_hierarchical_alltoallv=true"], "actor_config.moe_hierarchical_alltoallv", "MoE"),
    ],
)
def test_switches_that_need_other_keys_exit_2_naming_the_key(overrides, key, text, capsys):
    assert_refused(["--config-name", "ppo_tiny_cpu", "dry_run=true", *overrides], key, text, capsys)


def test_cpu_refuses_what_only_mindspeed_implements_and_runs_recompute_norm_with_megatron_core():
    swap = ["actor_config.use_distributed_optimizer=true", "+actor_config.swap_optimizer=true"]
    with pytest.raises(UserError, match="actor_config.swap_optimizer: a MindSpeed switch .* on cpu"):
        preflight(load_ppo_config("ppo_tiny_cpu", swap), get_accelerator())
    preflight(load_ppo_config("ppo_tiny_cpu", ["+actor_config.recompute_norm=true"]), get_accelerator())
    norm = tiny_role(recompute_norm=True).megatron
    assert recompute_fields(norm, CpuAccelerator) == {
        "recompute_granularity": "selective",
        "recompute_modules": ["layernorm"],
    }
    both = tiny_role(recompute_norm=True, recompute_granularity="selective").megatron
    assert recompute_fields(both, CpuAccelerator)["recompute_modules"] == ["core_attn", "layernorm"]
    assert recompute_fields(norm, NpuAccelerator) == {"recompute_granularity": None}  # MindSpeed's own on NPU


def test_on_npu_the_switches_reach_mindspeed_as_its_flags(monkeypatch):
    m = tiny_role(
        bf16=True, reuse_fp32_param=True, recompute_activation_function=True, recompute_activation_function_num_layers=2
    ).megatron
    argv = mindspeed_argv(m)
    counted = ["--recompute-activation-function-num-layers", "2"]
    assert argv == ["--recompute-activation-function", *counted, "--reuse-fp32-param"]
    monkeypatch.setattr(sys, "argv", ["worker"])
    NpuAccelerator.use_mindspeed_switches(None, argv)
    NpuAccelerator.use_mindspeed_switches(None, argv)  # once per process
    assert sys.argv == ["worker", *argv]
    with pytest.raises(ValueError, match="do not run on cpu"):
        CpuAccelerator().use_mindspeed_switches(argv)


def test_each_recomputation_keeps_less_activation_memory():
    model = tiny_model_config(num_layers=2)
    batch = {"input_ids": torch.randint(1, 200, (2, 64)), "attention_mask": torch.ones(2, 64, dtype=torch.long)}
    kept = {label: saved for label, saved, _ in measure(model, "tiny", batch, 1)}
    none, norm, attn, both, mlp, full = (kept[label] for label, _ in SETTINGS)
    assert norm < none and attn < none and both < min(norm, attn) and mlp < none and full < min(both, mlp)
    assert full < 0.5 * none  # the layers keep their inputs only (the head and the loss keep theirs)


def test_on_npu_a_switch_the_installed_mindspeed_release_does_not_define_exits_2_naming_it(monkeypatch):
    """The flags recorded per pinned MindSpeed release (compat/mindspeed.py) cover every switch, the branches are
    the ones the NPU sets pin, and a switch whose flag the installed release lacks is refused on NPU."""
    import os

    from mindspeed_rl.compat import mindspeed
    from mindspeed_rl.compat.stack import REQUIREMENTS_DIR
    from mindspeed_rl.config_cls.megatron_config import MINDSPEED_SWITCHES
    from mindspeed_rl.features.memory import check_mindspeed_switches

    pins = "".join(open(os.path.join(REQUIREMENTS_DIR, f)).read() for f in ("npu.txt", "npu-current.txt"))
    assert all(f"branch {branch}" in pins for branch in mindspeed.BRANCHES.values())
    defined = {flag for flags in mindspeed.FLAGS.values() for flag in flags}
    assert set(MINDSPEED_SWITCHES.values()) - defined == {"--moe-hierarchical-alltoallv"}
    npu = NpuAccelerator.__new__(NpuAccelerator)
    for version in mindspeed.BRANCHES:
        monkeypatch.setattr(mindspeed, "installed_version", lambda v=version: v)
        check_mindspeed_switches(tiny_role(bf16=True, reuse_fp32_param=True), npu)
        with pytest.raises(UserError, match=f"actor_config.moe_hierarchical_alltoallv: .*MindSpeed {version}"):
            check_mindspeed_switches(tiny_role(moe_hierarchical_alltoallv=True), npu)
    monkeypatch.setattr(mindspeed, "installed_version", lambda: "0.20.0")  # a release nothing is recorded for
    check_mindspeed_switches(tiny_role(moe_hierarchical_alltoallv=True), npu)
