"""PPO math in plain torch: advantages, KL, losses, aggregation. No Ray, no Megatron.

Tensors are [batch, response_length] over response tokens; ``mask`` is 1 on real response tokens.
"""
from .advantages import (compute_gae, group_norm_advantages, masked_mean, masked_var, masked_whiten,
                         token_level_rewards)
from .kl import AdaptiveKLController, FixedKLController, kl_penalty, make_kl_controller
from .losses import aggregate_token_mean, entropy_loss, policy_loss, value_loss

__all__ = ["compute_gae", "group_norm_advantages", "masked_mean", "masked_var", "masked_whiten",
           "token_level_rewards", "AdaptiveKLController", "FixedKLController", "kl_penalty",
           "make_kl_controller", "aggregate_token_mean", "entropy_loss", "policy_loss", "value_loss"]
