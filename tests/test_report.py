"""The HTML run report, rendered from a small metrics.jsonl and run.json."""

import base64
import json
import re
import subprocess
import sys

from mindspeed_rl.config_cls.ppo_config import to_plain
from mindspeed_rl.features import load_ppo_config
from mindspeed_rl.features.precision import HostPrecision, settle_precision
from mindspeed_rl.trainer.report import report
from tests.conftest import ROOT


def write_run(run_dir, iterations=4):
    cfg = load_ppo_config("ppo_tiny_cpu", [])
    settle_precision(cfg, HostPrecision(False, "this CPU has no native bf16: AVX2"))  # as a run settles it
    resolved = {k: v for k, v in to_plain(cfg).items() if k != "raw"}
    report.write_run_info(
        str(run_dir),
        cfg.raw,
        resolved,
        "Batch plan\n  iteration : 16 prompts x 8 samples",
        ["cli/train_ppo.py", "--config-name", "ppo_tiny_cpu"],
    )
    rows = [{"iteration": 0, "val/score/mean": 0.125, "val/response_length/mean": 16.0}]
    for i in range(1, iterations + 1):
        rows.append(
            {
                "iteration": i,
                "critic/score/mean": 0.1 * i,
                "actor/kl_loss": 0.01 * i,
                "actor/entropy": 5.0 - i,
                "response_length/mean": 10.0 + i,
                "response_length/max": 16.0,
                "response_length/min": 2.0,
                "timing/all": 3.0,
                "timing/rollout": 1.0,
                "timing/update": 1.5,
                "timing/reference_model": 0.5,
                "e2e_tps": 100.0 * i,
                "update_tps": 300.0,
                "vllm_tps": 500.0,
            }
        )
    rows[2]["val/score/mean"] = 0.75
    with open(run_dir / "metrics.jsonl", "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rows)


def test_report_is_self_contained_with_summary_plan_curves_and_final_numbers(tmp_path):
    write_run(tmp_path)
    path = report.render(str(tmp_path))
    text = open(path, encoding="utf-8").read()
    # self-contained: every image embedded, nothing fetched from elsewhere
    images = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", text)
    assert len(images) == 6  # score, KL, entropy, length, throughput, stacked timing
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert "http://" not in text and "https://" not in text and "<script" not in text
    # config summary from the resolved config, the batch plan, the command
    assert "<th>model</th><td>tiny_qwen25</td>" in text
    assert "<th>samples per prompt</th><td>8</td>" in text
    assert "<th>precision</th><td>fp32 (bf16: auto; this CPU has no native bf16: AVX2); rollout engines" in text
    assert "<th>advantages / policy loss / aggregation</th><td>gae / vanilla / token-mean</td>" in text
    assert "16 prompts x 8 samples" in text and "--config-name ppo_tiny_cpu" in text
    # the final numbers: last iteration, first -> last score, validation first -> last and best
    assert "<th>iterations</th><td>4</td>" in text
    assert "<th>critic/score/mean (first -&gt; last)</th><td>0.1000 -&gt; 0.4000</td>" in text
    assert "0.1250 (iteration 0) -&gt; 0.7500 (iteration 2)" in text
    assert "<th>val/score/mean (best)</th><td>0.7500 (iteration 2)</td>" in text
    assert "<th>e2e_tps (last)</th><td>400</td>" in text
    assert "<th>training time (sum of timing/all)</th><td>12.0 s</td>" in text


def test_report_on_demand_cli(tmp_path, capsys):
    write_run(tmp_path, iterations=2)
    assert report.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("report.html")
    assert report.main([str(tmp_path / "missing")]) == 2
    assert "no metrics" in capsys.readouterr().err
    command = [sys.executable, "-m", "mindspeed_rl.trainer.report", str(tmp_path)]  # the documented command
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0 and done.stdout.strip().endswith("report.html"), done.stderr


def test_report_without_run_json_still_renders_the_curves(tmp_path):
    write_run(tmp_path, iterations=2)
    (tmp_path / "run.json").unlink()
    text = open(report.render(str(tmp_path)), encoding="utf-8").read()
    assert "Config summary" not in text and text.count("data:image/png;base64,") == 6


def test_timeline_shows_who_does_what_when(tmp_path):
    """timeline.jsonl (written by the trainer each iteration) becomes a picture of the last iterations, with
    the rollout workers' generation overlapping the actor's update (asynchronous rollout)."""
    from mindspeed_rl.trainer.report.loggers import MetricsLogger

    write_run(tmp_path)
    logger = MetricsLogger(str(tmp_path), 4)
    t = 1000.0
    for it in range(1, 4):
        logger.timeline(
            it,
            t,
            t + 3.0,
            [
                ("actor", "timing/rollout_wait", t, t + 0.2),
                ("actor", "timing/update", t + 0.5, t + 2.5),
                ("rollout workers", "timing/rollout", t + 0.4, t + 2.9),
                ("actor", "timing/weight_sync", t + 2.6, t + 3.0),
                ("rollout workers", "timing/weight_sync", t + 2.9, t + 3.0),
            ],
        )
        t += 3.0
    rows = report.read_timeline(str(tmp_path / "timeline.jsonl"))
    assert [r["iteration"] for r in rows] == [1, 2, 3] and rows[0]["spans"][2][:2] == [
        "rollout workers",
        "timing/rollout",
    ]
    title, png = report.timeline_figure(rows)
    assert title == "Timeline" and base64.b64decode(png).startswith(b"\x89PNG")
    text = open(report.render(str(tmp_path)), encoding="utf-8").read()
    assert "alt='Timeline'" in text
    assert report.timeline_figure([{"iteration": 1, "start": 0, "end": 1, "spans": []}]) is None
