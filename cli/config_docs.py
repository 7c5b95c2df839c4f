"""Write docs/config.md from the typed sections (one source for validation and docs) after its opening,
docs/config_intro.md.

python cli/config_docs.py > docs/config.md (make docs)
"""

from __future__ import annotations

import dataclasses
import os
import typing

from mindspeed_rl.config_cls.async_config import AsyncTrainingConfig
from mindspeed_rl.config_cls.base import _type_name, yaml_spelling
from mindspeed_rl.config_cls.dpo_config import DPOConfig
from mindspeed_rl.config_cls.endpoint_config import PolicyEndpointConfig
from mindspeed_rl.config_cls.eval_config import EvalConfig
from mindspeed_rl.config_cls.fault_config import RolloutFaultToleranceConfig
from mindspeed_rl.config_cls.generate_config import GenerateConfig, SamplingConfig
from mindspeed_rl.config_cls.judge_config import JudgeConfig
from mindspeed_rl.config_cls.megatron_config import MegatronConfig
from mindspeed_rl.config_cls.model_config import ModelConfig
from mindspeed_rl.config_cls.profiler_config import RoleProfilerConfig
from mindspeed_rl.config_cls.rl_config import IntegratedModeConfig, ResourceConfig, RLConfig, RolloutCorrectionConfig

INTRO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "config_intro.md")

SECTIONS = [
    ("megatron_training / actor_config / critic_config / reward_config / teacher_config", MegatronConfig),
    ("model.<name> (configs/model/<name>.yaml)", ModelConfig),
    ("rl_config", RLConfig),
    (
        "rl_config.actor_resource / critic_resource / reward_resource / teacher_resource / judge_resource / rollout_resource",
        ResourceConfig,
    ),
    ("rl_config.integrated_mode_config", IntegratedModeConfig),
    ("rl_config.rollout_correction", RolloutCorrectionConfig),
    ("rl_config.async_training (docs/rollout.md)", AsyncTrainingConfig),
    ("rl_config.rollout_fault_tolerance (docs/operations.md)", RolloutFaultToleranceConfig),
    ("rl_config.policy_endpoint (docs/agents.md)", PolicyEndpointConfig),
    ("generate_config", GenerateConfig),
    ("generate_config.sampling_config", SamplingConfig),
    ("judge_config (docs/rewards.md, Generative judge)", JudgeConfig),
    ("eval_config (docs/evaluation.md)", EvalConfig),
    ("dpo_config (cli/train_dpo.py; docs/stages.md)", DPOConfig),
    ("profiler_config.integrated (or .actor) / .critic (docs/profiling.md)", RoleProfilerConfig),
]


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        return repr(f.default) if f.default is not None else "null"
    if f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
        return "(section)" if dataclasses.is_dataclass(value) else repr(value)
    return "**required**"


def _rules(f: dataclasses.Field) -> str:
    m = f.metadata
    parts = []
    if m.get("choices"):
        parts.append("one of " + ", ".join(f"`{yaml_spelling(c)}`" for c in m["choices"]))
    for key, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        if m.get(key) is not None:
            parts.append(f"{sym} {m[key]}")
    return "; ".join(parts)


def render() -> str:
    with open(INTRO, encoding="utf-8") as intro:
        out = [intro.read().split("\n", 1)[1]]  # without its first line, the comment that says what it is
    for title, cls in SECTIONS:
        hints = typing.get_type_hints(cls)
        out.append(f"\n## {title}\n\n{(cls.__doc__ or '').strip()}\n")
        out.append("| key | type | default | allowed | meaning |\n|---|---|---|---|---|")
        for f in dataclasses.fields(cls):
            out.append(
                f"| `{f.name}` | {_type_name(hints[f.name])} | {_default(f)} | {_rules(f)} | "
                f"{f.metadata.get('doc', '')} |"
            )
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
