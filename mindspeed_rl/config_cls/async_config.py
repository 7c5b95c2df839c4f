"""``rl_config.async_training``: fully asynchronous rollout (in-flight weight updates, the staleness bound); the
rules across its keys and max_head_offpolicyness are features/async_rollout.py's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .base import opt


@dataclass
class AsyncTrainingConfig:
    """Fully asynchronous rollout: weight updates that reach the engines while their requests are in flight."""

    in_flight_weight_updates: bool = opt(
        False,
        "NeMo-RL's key: with max_head_offpolicyness > 0, the actor's new weights reach the rollout engines while "
        "their requests are in flight (they pause between two engine steps, load, resume; every token records "
        "the version that sampled it) instead of after the batches produced ahead are done. false: those "
        "batches keep the weights they started with (deterministic: a resume repeats them exactly).",
    )
    update_weights_interval: int = opt(
        1,
        "Push the weights to the engines after every k-th update (miles' --update-weights-interval, verl's "
        "trigger_parameter_sync_step); at most max_head_offpolicyness + 1.",
        ge=1,
    )
    recompute_kv_cache_after_weight_updates: bool = opt(
        False,
        "NeMo-RL's key: after an in-flight update the requests' KV cache is recomputed under the new weights "
        "(miles' pause mode retract); false: generation continues on the kept cache (in_place).",
    )
    max_staleness: Optional[int] = opt(
        None,
        "A trajectory whose oldest token is more than this many policy versions behind the version it trains "
        "at is dropped or regenerated (stale_trajectories; miles' --max-weight-staleness, SkyRL's "
        "max_staleness_steps). null: the most it can be (no trajectory is stale).",
        ge=0,
    )
    stale_trajectories: str = opt(
        "drop",
        "What happens to a prompt group with a stale trajectory: drop (another prompt is drawn) or regenerate "
        "(its responses start again with the current weights).",
        choices=("drop", "regenerate"),
    )
    pause_timeout_s: float = opt(
        60.0,
        "Seconds an engine may take to pause for an update (its step in progress ends) before the run stops, "
        "naming the engine.",
        gt=0,
    )
