"""The generative judge (judge_config): its devices exactly with engines of its own, split into whole engines; a
template that shows the judge the response; the plan's lines on how it is served and weighted."""

from __future__ import annotations

from typing import TYPE_CHECKING, List

from ..config_cls.base import ConfigError

if TYPE_CHECKING:
    from ..config_cls.run_config import PPOConfig


def derive(cfg: PPOConfig) -> None:
    """Over http the judge has no engines: rl_config.judge_resource is unused (the plan says so; no bundles)."""
    judge = cfg.judge
    if judge is not None and judge.serve == "http" and cfg.rl.judge_resource is not None:
        if "rl_config.judge_resource" not in judge.unused:
            judge.unused = [*judge.unused, "rl_config.judge_resource"]


def check(cfg: PPOConfig) -> None:
    judge, resource = cfg.judge, cfg.rl.judge_resource
    if judge is None:
        if resource is not None:
            raise ConfigError(
                "rl_config.judge_resource", "is set but no judge_config: nothing would run on those devices"
            )
        return
    if judge.serve == "engines":
        if resource is None:
            raise ConfigError("rl_config.judge_resource", "required with judge_config.serve engines: its devices")
        if resource.num_npus % judge.infer_tensor_parallel_size:
            raise ConfigError(
                "judge_config.infer_tensor_parallel_size",
                f"{judge.infer_tensor_parallel_size} does not divide rl_config.judge_resource.num_npus "
                f"{resource.num_npus}",
            )
    if judge.template is not None and "{response}" not in judge.template:
        raise ConfigError("judge_config.template", "has no {response}: the judge would not see what it grades")


def plan_lines(cfg: PPOConfig) -> List[str]:
    """The batch plan's lines on the judge: how it is served and weighted (a PPOConfig's ``judge``)."""
    j = cfg.judge
    if j is None:
        return []
    if j.serve == "http":
        where = (
            f"{j.base_url} model {j.model_name!r} ({j.api}), {j.concurrency} requests in flight, timeout {j.timeout:g}s"
        )
    else:
        engines = cfg.judge_devices // j.infer_tensor_parallel_size
        where = (
            f"{engines} engine(s) of infer TP {j.infer_tensor_parallel_size} on {cfg.judge_devices} device(s) of "
            f"its own, {j.load}"
        )
    when = "finished groups judged while the batch generates" if j.overlap else "after each scoring call"
    lines = [f"  judge     : weight {j.weight:g}; {where}; {when}"]
    if j.unused:
        lines.append(f"  judge keys: not used with serve {j.serve}: {', '.join(j.unused)}")
    return lines
