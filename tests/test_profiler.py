"""profiler_config: the section's refusals (exit 2 naming the key) and one worker's stage profiler: the chosen
stages, iterations and ranks traced, with their top operators, nothing else; mstx ranges alone trace nothing.
The end-to-end run (a PPO run's actor and critic profiled in iteration 2) is in tests/test_resume.py."""

import json
import os

import pytest
import torch

from mindspeed_rl.accelerator.cpu import CpuAccelerator
from mindspeed_rl.config_cls.profiler_config import build_profiler_config
from mindspeed_rl.trainer.report.profile_summary import stage_tables
from mindspeed_rl.workers.profiling import StageProfiler
from tests.helpers import assert_refused


@pytest.mark.parametrize(
    "override, key, text",
    [
        ("+profiler_config.integrated.stage=bogus", "profiler_config.integrated.stage", "unknown stage 'bogus'"),
        ("+profiler_config.critic.stage=[actor_update]", "profiler_config.critic.stage", "unknown stage"),
        ("+profiler_config.actor.profile_step_end=1", "profiler_config.actor.profile_step_end", ">= 2"),
        ("+profiler_config.actor.profile_step_start=3", "profiler_config.actor.profile_step_end", "must be after"),
        ("+profiler_config.critic.profile_ranks=[1]", "profiler_config.critic.profile_ranks", "beyond the critic's 1"),
        ("+profiler_config.actor.profile_ranks=one", "profiler_config.actor.profile_ranks", "expected all or a list"),
        ("+profiler_config.reward.profile=true", "profiler_config.reward", "unknown role"),
        ("+profiler_config.actor.profile_level=level9", "profiler_config.actor.profile_level", "level0"),
    ],
)
def test_a_bad_profiler_config_exits_2_naming_the_key(override, key, text, capsys):
    assert_refused(["--config-name", "ppo_tiny_cpu", override], key, text, capsys)


def test_the_actor_given_twice_or_a_critic_the_run_lacks_is_refused(capsys):
    both = ["+profiler_config.integrated.profile=true", "+profiler_config.actor.profile=true"]
    assert_refused(["--config-name", "ppo_tiny_cpu", *both], "profiler_config.actor", "given twice", capsys)
    critic = "+profiler_config.critic.profile=true"
    assert_refused(["--config-name", "grpo_tiny_cpu", critic], "profiler_config.critic", "does not start", capsys)


def test_every_stage_the_config_names_is_a_profiled_worker_method_and_none_else():
    """ROLE_STAGES and the workers' @profiled(...) names are written in two places: they must not drift."""
    import re

    from mindspeed_rl.config_cls.profiler_config import ROLE_STAGES

    root = os.path.join(os.path.dirname(__file__), "..", "mindspeed_rl", "workers")
    decorated = set()
    for role in ROLE_STAGES:
        source = open(os.path.join(root, f"{role}_worker.py"), encoding="utf-8").read()
        for line in re.findall(r"@profiled\((.*)\)", source):
            decorated |= set(re.findall(r'"(\w+)"', line)) - {"actor", "ref"}
    assert decorated == {stage for stages in ROLE_STAGES.values() for stage in stages}


def test_a_relative_save_path_is_made_absolute_on_the_driver(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = build_profiler_config({"critic": {"profile": True, "profile_save_path": "traces"}})
    assert config.roles["critic"].profile_save_path == str(tmp_path / "traces")


def run_stages(profiler, root, iterations=(1, 2, 3)):
    for iteration in iterations:
        profiler.at(iteration, root)
        for stage in ("actor_update", "actor_generate"):
            with profiler.stage(stage):
                a = torch.randn(48, 48)
                (a @ a).relu().sum()


def test_only_the_chosen_stages_iterations_and_ranks_are_traced(tmp_path):
    settings = build_profiler_config(
        {
            "integrated": {
                "profile": True,
                "stage": "actor_update",
                "profile_step_start": 2,
                "profile_step_end": 3,
                "profile_ranks": [1],
            }
        }  # fmt: skip
    ).of("actor")
    for rank in (0, 1):
        run_stages(StageProfiler(CpuAccelerator(), "actor", rank, settings), str(tmp_path))
    assert not os.path.exists(tmp_path / "actor" / "rank0")  # rank 0 is not chosen
    folder = tmp_path / "actor" / "rank1"
    assert sorted(os.listdir(folder)) == ["actor_update_iter2_1.json", "summary.jsonl"]
    with open(folder / "actor_update_iter2_1.json") as fh:
        names = {e.get("name") for e in json.load(fh)["traceEvents"]}
    assert "aten::mm" in names
    (row,) = [json.loads(line) for line in open(folder / "summary.jsonl")]
    assert row["stage"] == "actor_update" and row["iteration"] == 2 and row["trace"] == "actor_update_iter2_1.json"
    assert "aten::mm" in [op["name"] for op in row["top"]] and all(op["self_ms"] >= 0 for op in row["top"])


def test_the_report_tables_sum_each_stages_operators_over_calls_and_ranks(tmp_path):
    settings = build_profiler_config({"integrated": {"profile": True, "profile_step_end": 3}}).of("actor")
    for rank in (0, 1):
        run_stages(StageProfiler(CpuAccelerator(), "actor", rank, settings), str(tmp_path / "profiler"))
    tables = dict(stage_tables(str(tmp_path)))
    titles = sorted(tables)
    assert [t.split(":")[0] for t in titles] == ["actor actor_generate", "actor actor_update"]
    assert all("4 traced call(s)" in t for t in titles)  # iterations 1 and 2 on two ranks
    mm = [op for op in tables[titles[1]] if op["name"] == "aten::mm"][0]
    assert mm["calls"] == 4


def test_ranges_alone_trace_nothing_and_level_none_runs_no_profiler(tmp_path):
    settings = build_profiler_config({"actor": {"mstx": True, "profile": True, "profile_level": "level_none"}}).of(
        "actor"
    )
    profiler = StageProfiler(CpuAccelerator(), "actor", 0, settings)
    run_stages(profiler, str(tmp_path))
    assert profiler.ranges and not os.listdir(tmp_path)
    with torch.profiler.profile() as outer:  # an outside profiler sees the stage as a named range
        run_stages(profiler, str(tmp_path), iterations=(1,))
    assert "actor_update" in {e.key for e in outer.key_averages()}
