"""The benches' training commands stay valid configs: a rule added later must not leave a bench that fails at
start (bench/ppo_iteration.py did once: its seq_length fell below prompt + response)."""

import pytest


@pytest.mark.parametrize("dtype,packing", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_the_ppo_iteration_bench_command_validates(tmp_path, capsys, dtype, packing):
    from bench.ppo_iteration import overrides
    from cli import train_ppo

    args = overrides("small", dtype, 2, 32, 64, str(tmp_path), "fixed", packing, 16)
    assert train_ppo.main(["--config-name", "ppo_tiny_cpu", *args, "dry_run=true"]) == 0, capsys.readouterr().err
