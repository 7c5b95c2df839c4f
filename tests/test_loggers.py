"""metrics.jsonl, tensorboard scalars, wandb and SwanLab offline, PNG curves."""

import glob
import json
import os

import pytest

from mindspeed_rl.config_cls import RLConfig
from mindspeed_rl.trainer.report import curves
from mindspeed_rl.trainer.report.loggers import MetricsLogger


def rows(n=3):
    return [
        {
            "iteration": i,
            "critic/score/mean": 0.1 * i,
            "critic/score/max": 1.0,
            "critic/score/min": 0.0,
            "response_length/mean": 10.0 + i,
            "timing/all": 2.0,
            "e2e_tps": 100.0 * i,
        }
        for i in range(1, n + 1)
    ]


def test_jsonl_tensorboard_wandb_and_curves(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rl = RLConfig(
        use_tensorboard=True,
        use_wandb=True,
        wandb_project="p",
        wandb_exp_name="e",
        wandb_save_dir=str(tmp_path / "wandb"),
        use_swanlab=True,
        swanlab="offline",
        swanlab_project="p",
        swanlab_exp_name="e",
        swanlab_save_dir=str(tmp_path / "swanlog"),
        console_metrics=True,
    )
    monkeypatch.setenv("SWANLAB_SAVE_DIR", str(tmp_path / ".swanlab"))  # its settings folder, not ~/.swanlab
    logger = MetricsLogger(str(tmp_path / "run"), 3, rl, config={"rl_config": {"n_samples_per_prompt": 8}})
    for row in rows():
        logger.log(dict(row))
    logger.close()
    out = capsys.readouterr().out
    assert "iter 2/3 | score 0.200 | len 12.0 | step 2.00s | e2e_tps 200 | ETA 2s" in out
    assert "e2e_tps: 200" in out  # console_metrics: every metric by name as well
    lines = [json.loads(x) for x in open(tmp_path / "run" / "metrics.jsonl")]
    assert [x["iteration"] for x in lines] == [1, 2, 3] and list(lines[0])[0] == "iteration"
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    assert "critic/score/mean" in events.Tags()["scalars"]
    assert [round(e.value, 6) for e in events.Scalars("e2e_tps")] == [100.0, 200.0, 300.0]
    assert any(d.startswith("offline-run") for d in os.listdir(tmp_path / "wandb" / "wandb"))
    assert swanlab_scalars(tmp_path / "swanlog")["e2e_tps"] == [(1, 100.0), (2, 200.0), (3, 300.0)]
    for name in ("reward.png", "response_length.png", "timing.png"):
        path = tmp_path / "run" / name
        assert path.is_file() and open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def swanlab_scalars(log_dir):
    """{key: [(step, value)]} read back from the one SwanLab run under ``log_dir`` (its record file)."""
    from swanlab.proto.swanlab.record.v1.record_pb2 import Record
    from swanlab.sdk.internal.core_python.store import DataStoreReader

    (path,) = glob.glob(os.path.join(log_dir, "run-*", "*.swanlab"))
    reader, scalars = DataStoreReader(), {}
    reader.open(path)
    while (data := reader.scan()) is not None:
        record = Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "scalar":
            scalars.setdefault(record.scalar.key, []).append((record.scalar.step, record.scalar.value.number))
    return scalars


def test_a_tracker_that_is_not_installed_is_refused_naming_its_key(monkeypatch):
    import importlib.util

    from mindspeed_rl.config_cls.base import ConfigError
    from mindspeed_rl.features.tracking import check_trackers as check_logging_keys

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "swanlab" else real(name, *a))
    check_logging_keys(RLConfig(use_wandb=True))
    with pytest.raises(ConfigError, match="rl_config.use_swanlab: swanlab is not installed"):
        check_logging_keys(RLConfig(use_swanlab=True))


def test_curves_cli(tmp_path, capsys):
    with open(tmp_path / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows(4))
        fh.write('{"iteration": 5, "critic/sc')  # a run killed mid-line
    assert curves.main([str(tmp_path)]) == 0
    assert "reward.png" in capsys.readouterr().out
    assert curves.main([str(tmp_path / "nope")]) == 2


def test_the_console_is_one_compact_line_per_iteration_by_default(tmp_path, capsys):
    logger = MetricsLogger(str(tmp_path / "run"), 200, RLConfig())
    for row in rows(3):
        logger.log(dict(row, **{"actor/kl_loss": 0.01234, "critic/score/max": 1.0}))
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"iter {i}/200 | score {0.1 * i:.3f} | kl 0.0123 | len {10 + i:.1f} | step 2.00s | e2e_tps {100 * i} | ETA {m}"
        for i, m in ((1, "6m38s"), (2, "6m36s"), (3, "6m34s"))
    ]
    logger.log(dict(rows(4)[-1], **{"val/score/mean": 0.75}))
    assert "| score 0.400 | val 0.750 | len 14.0 |" in capsys.readouterr().out
    line = json.loads(open(tmp_path / "run" / "metrics.jsonl").readline())
    assert line["critic/score/max"] == 1.0  # the full dict still goes to metrics.jsonl
