"""dpo_config: the preference-optimisation loss of cli/train_dpo.py (MindSpeed-LLM's key names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Any

from .base import ConfigError, opt


@dataclass
class DPOConfig:
    """Which loss learns from the preference pairs, and how strongly."""

    dpo_loss_type: str = opt(
        "sigmoid",
        "sigmoid: DPO (with dpo_label_smoothing: conservative DPO); ipo: IPO; simpo: SimPO (reference-free, "
        "length-normalised).",
        choices=("sigmoid", "ipo", "simpo"),
    )
    dpo_beta: float = opt(
        0.1, "beta: the strength of the implicit KL to the reference (SimPO: the reward scale).", gt=0
    )
    dpo_label_smoothing: float = opt(
        0.0, "sigmoid: the probability that a pair's preference is wrong (conservative DPO).", ge=0, lt=0.5
    )
    ipo_length_normalized: bool = opt(
        True,
        "ipo: each answer's log-ratio averaged over its tokens before the square (Azar et al.'s and TRL's IPO); false: "
        "summed over them.",
    )
    simpo_gamma: float = opt(0.5, "simpo: the reward margin the chosen answer must win by.", ge=0)
    ref_model: str = opt(
        "", "The reference's checkpoint (default: the starting model, actor_config.load; with LoRA the base model)."
    )

    @property
    def uses_reference(self) -> bool:
        return self.dpo_loss_type != "simpo"

    def describe(self, m: Any) -> str:
        """The batch plan's account of the loss and the reference (``m``: the policy's MegatronConfig)."""
        names = {"sigmoid": "DPO", "ipo": "IPO", "simpo": "SimPO, reference-free"}
        extra = ""
        if self.dpo_loss_type == "sigmoid" and self.dpo_label_smoothing:
            extra = f", label smoothing {self.dpo_label_smoothing:g}"
        elif self.dpo_loss_type == "simpo":
            extra = f", gamma {self.simpo_gamma:g}"
        if not self.uses_reference:
            reference = "none"
        elif m.lora_r:
            reference = "the base model (adapters off)"
        else:
            reference = self.ref_model or m.load or "the seeded initial model"
        return f"{names[self.dpo_loss_type]}, beta {self.dpo_beta:g}{extra}; the reference: {reference}"

    def check(self, path: str = "dpo_config", given: AbstractSet[str] = frozenset()) -> None:
        if self.dpo_label_smoothing and self.dpo_loss_type != "sigmoid":
            raise ConfigError(
                f"{path}.dpo_label_smoothing", f"applies to dpo_loss_type sigmoid, not {self.dpo_loss_type}"
            )
        if "ipo_length_normalized" in given and self.dpo_loss_type != "ipo":
            raise ConfigError(
                f"{path}.ipo_length_normalized", f"applies to dpo_loss_type ipo, not {self.dpo_loss_type}"
            )
        if self.ref_model and not self.uses_reference:
            raise ConfigError(f"{path}.ref_model", "simpo has no reference model; remove it")
