"""Write docs/config.md from the typed sections (one source for validation and docs).

python -m mindspeed_rl.config_cls.docs > docs/config.md
"""

from __future__ import annotations

import dataclasses
import typing

from .base import _type_name, yaml_spelling
from .dpo_config import DPOConfig
from .generate_config import GenerateConfig, SamplingConfig
from .judge_config import JudgeConfig
from .megatron_config import MegatronConfig
from .model_config import ModelConfig
from .profiler_config import RoleProfilerConfig
from .rl_config import IntegratedModeConfig, ResourceConfig, RLConfig, RolloutCorrectionConfig

INTRO = """# Config reference

Generated from `mindspeed_rl/config_cls/` by `python -m mindspeed_rl.config_cls.docs > docs/config.md`;
a test keeps the two in step.

A run config is composed by Hydra, as in MindSpeed-RL:

    python cli/train_ppo.py --config-name ppo_qwen25_32b_A3 rl_config.n_samples_per_prompt=4 dry_run=true

- `defaults:` pulls model files from `configs/model/` (`- model: [qwen25_32b]`) and `megatron_training.model`
  (or a role's `model`) picks one; a model named there but not listed in `defaults` is read from
  `configs/model/<name>.yaml`.
- `actor_config`, `critic_config` (and `reward_config` for a reward model, `teacher_config` for an on-policy
  distillation teacher) take any key of `megatron_training` and override it for that role.
- Overrides `section.key=value` may set any key below, whether or not the YAML spells it out.
- `dry_run=true` validates, prints the batch plan and exits 0.

Every key is checked before anything heavy starts. A wrong key, type or range, or a rule that
involves several keys, stops the run with exit code 2 and one message naming the full key path
(and the closest known key when the name is misspelt). Rules across keys:

- `global_batch_size x n_samples_per_prompt` must be a multiple of `rl_config.mini_batch_size`
  (mini-batches count responses).
- `mini_batch_size` must be a multiple of `micro_batch_size x DP` of the actor and the critic,
  where `DP = num_npus / (TP x PP x CP)`.
- `TP x PP x CP` must divide the role's `num_npus`; TP must divide the heads and the query groups; with
  `ulysses_cp_algo` CP must divide the heads per TP rank, and the query groups per TP rank must split over CP
  or divide it (docs/long_context.md).
- `infer_tensor_parallel_size` must be a multiple or a divisor of the actor's TP and divide its devices.
- `max_prompt_length + sampling_config.max_tokens <= max_model_len` and `<= megatron_training.seq_length`;
  `max_model_len <=` the actor model's `max_position_embeddings`.
- `verifier_function` and `verifier_weight` have the same length; each verifier is a registered name or a
  `module:function` that imports (a failing import is refused naming the entry).
- the actor's and the critic's `save` folders differ; `bf16` and `fp16` are not both set.
- `num_layer_list` (uneven pipeline stages) lists PP positive counts summing to `num_layers`.
- tokenizer, data and `load` folders must exist (`dry_run` reports them as warnings).
- the algorithm (docs/algorithms.md): a group estimator (`group_norm`/`grpo`, `dr_grpo`, `rloo`,
  `reinforce_plus_plus_baseline`) or `filter_groups_enable` needs `n_samples_per_prompt >= 2`;
  `use_kl_in_reward: true` needs a KL coefficient (`init_kl_coef > 0` or the adaptive controller);
  `clip_higher_enable: true` needs `clip_ratio_high`, and `false` refuses a set `clip_ratio_low/high`;
  `loss_agg_mode` and `token_level_loss` must agree when both are given; `filter_groups_metric` is
  `score` or a listed verifier; `filter_groups_*` keys need `filter_groups_enable`; the overlong buffer
  is shorter than `rollout_max_tokens`, itself at most `sampling_config.max_tokens`.
- with dynamic sampling, `filter_groups_train_batch_size` (not `global_batch_size`) x `n_samples_per_prompt`
  is the count `mini_batch_size` must divide.
- roles the algorithm does not start (the critic of GRPO / DAPO) are not checked.

Names: MindSpeed-RL's where it has them, verl's where it does not, and both where they differ.

| here | MindSpeed-RL | verl |
|---|---|---|
| `adv_estimator: group_norm` (alias `grpo`) | `group_norm` | `grpo` |
| `kl_penalty: kl / mse / low_var_kl` (aliases `k1 / k2 / k3`, `k1+`, `k3+`) | `kl`, `low_var_kl` | `k1`, `k2`, `k3`, `k1+`, `k3+` |
| `token_level_loss` / `loss_agg_mode` | `token_level_loss` | `loss_agg_mode` |
| `clip_higher_enable`, `clip_ratio_low`, `clip_ratio_high` | same | `clip_ratio_low`, `clip_ratio_high` |
| `overlong_buffer_enable`, `overlong_buffer`, `overlong_buffer_penalty_factor`, `rollout_max_tokens` | same | `reward_model.overlong_buffer.{enable,len,penalty_factor}` |
| `filter_groups_enable`, `filter_groups_metric`, `filter_groups_max_batches`, `filter_groups_train_batch_size` | same | `algorithm.filter_groups.{enable,metric,max_num_gen_batches}`, `data.train_batch_size` |
| `policy_loss: vanilla / gspo / cispo / sapo / gmpo` | - | `actor.policy_loss.loss_mode` (`geo_mean` for gmpo) |
| `tau_pos`, `tau_neg` (SAPO) | - | `actor.tau_pos`, `actor.tau_neg` |
| `rollout_correction.rollout_is`, `rollout_is_threshold` | - | `algorithm.rollout_correction.*` |
| `use_kl_in_reward`, `init_kl_coef`, `kl_ctrl_type` | same | `algorithm.use_kl_in_reward`, `algorithm.kl_ctrl.*` |

Flags that only mean something on one device (fused kernels, flash attention, sequence parallel,
gradient-accumulation fusion) are accepted on every device and mapped to what the device has; the
log says so once.
"""

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
    ("generate_config", GenerateConfig),
    ("generate_config.sampling_config", SamplingConfig),
    ("judge_config (docs/rewards.md, Generative judge)", JudgeConfig),
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
    out = [INTRO]
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
