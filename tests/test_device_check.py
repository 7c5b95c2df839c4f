"""bench/device_check.py --smoke: every step at toy sizes on this CPU, without the packages an NVIDIA vendor
image lacks (scripts/offline_bundle.sh carries only megatron-core, hydra-core, omegaconf and antlr4)."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# absent from the vendor image and not bundled: importing any of them is a failure of the check
NOT_ON_THE_IMAGE = ("ray", "vllm", "math_verify", "wandb", "transformer_engine", "apex")
LAUNCH = (
    "import runpy, sys\n"
    "for name in {blocked!r}:\n"
    "    sys.modules[name] = None  # import raises ImportError\n"
    "sys.argv = ['bench/device_check.py', *sys.argv[1:]]\n"
    "runpy.run_path('bench/device_check.py', run_name='__main__')\n"
)


def test_device_check_smoke_runs_every_step_without_ray_or_vllm(tmp_path):
    out = tmp_path / "results"
    code = LAUNCH.format(blocked=NOT_ON_THE_IMAGE)
    env = dict(os.environ, MINDSPEED_RL_DEVICE="cpu", PYTHONPATH=ROOT)
    proc = subprocess.run(
        [sys.executable, "-c", code, "--smoke", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "device_check.json").read_text())
    steps = report["steps"]
    assert list(steps) == [
        "environment", "parity", "training", "head", "algorithms", "generation", "profile", "fused_kernels",
        "training_7b", "profile_7b",
    ]  # fmt: skip
    assert all(s["status"] == "ok" for s in steps.values()), {k: s["error"] for k, s in steps.items()}
    fp32, bf16 = steps["parity"]["result"]
    assert fp32["dtype"] == "float32" and fp32["max_abs_logprob_diff"] < 1e-4
    assert bf16["max_abs_logprob_diff"] < 0.1
    training = steps["training"]["result"]
    assert len(training) == 16 and all(row["tokens_per_s"] > 0 and row["MFU"] > 0 for row in training)
    assert {row["layout"] for row in training} == {"padded", "packed"}
    assert all(row["ok"] for row in steps["algorithms"]["result"])
    assert all(row["tokens_per_s"] > 0 for row in steps["generation"]["result"])
    profile = steps["profile"]["result"]
    assert profile[0]["cpu_ms"] > 0 and len(profile) > 5  # the step's wall time, then the costliest operators
    assert steps["fused_kernels"]["result"] == [
        dict(check="fused kernels", result="skipped: no liger-kernel kernels on cpu")
    ]
    (wide,) = steps["training_7b"]["result"]  # torch's modules only: liger-kernel's are CUDA's
    assert wide["model"] == "7B widths x 2 layers" and wide["tokens_per_s"] > 0 and wide["MFU"] > 0, wide
    wide_profile = steps["profile_7b"]["result"]
    assert wide_profile[0]["cpu_ms"] > 0 and len(wide_profile) > 5
    markdown = (out / "device_check.md").read_text()
    assert "### training: ok" in markdown and "| packed | full |" in markdown


def test_device_check_refuses_an_unknown_step(tmp_path):
    proc = subprocess.run(
        [sys.executable, "bench/device_check.py", "--smoke", "--out", str(tmp_path), "--steps", "parity,warp"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "--steps: unknown ['warp']" in proc.stderr


def test_bundle_and_installer_refuse_bad_input_before_any_download(tmp_path):
    def run(*argv):
        return subprocess.run(["bash", *argv], cwd=ROOT, capture_output=True, text=True, timeout=60)

    bad_python = run("scripts/offline_bundle.sh", "312", "manylinux_2_28_x86_64", str(tmp_path / "w"))
    assert bad_python.returncode == 2 and "python-version: '312'" in bad_python.stderr
    bad_platform = run("scripts/offline_bundle.sh", "3.12", "win_amd64", str(tmp_path / "w"))
    assert bad_platform.returncode == 2 and "platform: 'win_amd64'" in bad_platform.stderr
    assert not (tmp_path / "w").exists()
    no_wheels = run("scripts/device_check.sh", str(tmp_path), str(tmp_path / "results"))
    assert no_wheels.returncode == 2 and "holds no wheels" in no_wheels.stderr


def test_the_7b_row_takes_as_many_layers_as_fit_with_adam_and_half_the_memory_for_activations():
    from bench.device_steps import WIDE
    from bench.device_training import layers_that_fit

    # 80 GiB (H100): (40 GiB / 18 bytes - 1.09B embedding and head) / 233M per layer = 5; H200 is capped at 8
    assert [layers_that_fit(WIDE, gib * 2**30) for gib in (80, 141, 16)] == [5, 8, 1]
