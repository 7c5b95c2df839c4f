"""RL math in plain torch: advantage estimators, KL, losses, aggregation, shaping, distillation, preference
(reward-model) losses. No Ray, no Megatron.

Tensors are [batch, response_length] over response tokens; ``mask`` is 1 on real response tokens.
The names a config can choose (estimators, losses, KL forms) and a run's algorithm plan are registered
at the foundations (``config_cls/algorithm_choice.py``); ``advantages.estimate`` and ``losses.policy_loss``
call the chosen function. The modules are loaded on first use.
"""

import importlib

_EXPORTS = {
    "advantages": (
        "compute_gae",
        "estimate",
        "gae_advantages",
        "group_norm_advantages",
        "grpo_advantages",
        "dr_grpo_advantages",
        "rloo_advantages",
        "reinforce_plus_plus_advantages",
        "reinforce_plus_plus_baseline_advantages",
        "masked_mean",
        "masked_var",
        "masked_whiten",
        "sequence_rewards",
        "token_level_rewards",
    ),
    "distillation": ("distill_advantages", "mix_advantages", "reverse_kl_advantages", "teacher_student_kl"),
    "kl": ("AdaptiveKLController", "FixedKLController", "kl_penalty", "make_kl_controller"),
    "losses": (
        "Clip",
        "LossScale",
        "aggregate",
        "aggregate_token_mean",
        "cispo_policy_loss",
        "entropy_loss",
        "gmpo_policy_loss",
        "gspo_policy_loss",
        "policy_loss",
        "sapo_policy_loss",
        "value_loss",
        "vanilla_policy_loss",
    ),
    "preference": ("bradley_terry_loss", "preference_metrics"),
    "rollout_correction": ("mismatch_metrics", "truncated_is_weights"),
    "shaping": ("informative_groups", "overlong_penalty"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
