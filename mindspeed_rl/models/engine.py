"""Megatron-core engine of one role: model (TP/PP/DP), optimizer and lr schedule (built in ``optimizer.py``),
micro-batching; the last pipeline stage's metrics and outputs reach the other ranks through ``cross_rank.py``.

The engine knows nothing about PPO. A loss function is passed in; it receives the head's
outputs for one micro-batch (``log_probs``/``entropy`` for an LM head, ``values`` for a value
head, each aligned with the tokens: position t holds the quantity that predicts or values
token t, position 0 is 0) and returns ``(loss, metrics)``, where ``loss`` is the micro-batch's
share of the mini-batch loss (already divided by the mini-batch's global normaliser, summed
over micro-batches and data-parallel ranks). The engine undoes megatron's division by the
number of micro-batches and DP's gradient averaging, so the gradient is exactly d(sum of
shares)/d(theta).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from ..accelerator import get_accelerator
from ..config_cls.ppo_config import RoleConfig
from ..families.vision.vl_model import freeze_vision, vision_of
from .batch_invariant import batch_invariant
from .builder import build_gpt_model
from .cross_rank import broadcast_from_last_stage, reduce_metrics
from .engine_weights import EngineWeights
from .heads import attach_value_head, chunked_log_probs, output_weight, return_hidden_states
from .optimizer import build_optimizer, fuse_adam_steps, step_unless_nonfinite, wrap_ddp
from .packing import ModelInput, pack, restore_order, round_up, token_budget_groups, trim

Batch = Dict[str, torch.Tensor]
LossFn = Callable[[Dict[str, torch.Tensor], Batch], Tuple[torch.Tensor, Dict[str, float]]]


def split_micro_batches(batch: Batch, micro_batch_size: int) -> List[Batch]:
    size = next(iter(batch.values())).shape[0]
    return [{k: v[i : i + micro_batch_size] for k, v in batch.items()} for i in range(0, size, micro_batch_size)]


@dataclass
class StepResult:
    loss: float
    grad_norm: float
    lr: float
    update_successful: bool
    metrics: Dict[str, float]
    skipped: bool = False  # a non-finite loss, gradient or gradient norm: the step's gradient was dropped


class MegatronEngine(EngineWeights):
    """One role's megatron-core model on this rank, trainable or frozen.

    head: "lm" (actor, reference) or "value" (critic, reward model); remove_padding: forwards and updates
    on packed valid tokens only (rl_config.use_remove_padding).
    """

    def __init__(
        self,
        role: RoleConfig,
        *,
        head: str = "lm",
        trainable: bool = True,
        total_steps: int = 1,
        vocab_size: Optional[int] = None,
        value_head_init_std: float = 0.0,
        remove_padding: bool = False,
    ):
        from megatron.core import parallel_state as ps

        if head not in ("lm", "value"):
            raise ValueError(f"head must be 'lm' or 'value', got {head!r}")
        self.role, self.head, self.trainable = role, head, trainable
        self.remove_padding = remove_padding  # rl_config.use_remove_padding
        self.nonfinite_streak = 0  # steps skipped in a row for a NaN/Inf loss or gradient (not fp16 backoffs)
        self.megatron = role.megatron
        self.acc = get_accelerator()
        self.device = self.acc.current_device()
        # interleaved pipeline (VPP): this rank's model chunks, its layers numbered across them in chunk order
        vpp = role.megatron.virtual_stages(role.model.num_layers)
        chunks: List = []
        for c in range(vpp):  # the chunks share one config (the schedule reads the first chunk's)
            config = chunks[0].config if chunks else None
            stage = c if vpp > 1 else None
            chunks.append(
                build_gpt_model(role.model, role.megatron, vocab_size=vocab_size, vp_stage=stage, config=config)
            )
        self.chunk_offsets = [sum(len(ch.decoder.layers) for ch in chunks[:c]) for c in range(vpp)]
        gpt = chunks[-1]  # the chunk with the head (on the last pipeline rank)
        if head == "value":
            attach_value_head(gpt, role.model.hidden_size, init_std=value_head_init_std)
        else:
            return_hidden_states(gpt)  # log-probs come from the hidden states chunk by chunk (heads.py)
        self.config = gpt.config
        # a vision-language model: (image token, spatial merge) for its micro-batches' 3D positions
        self.vision = vision_of(role.model, remove_padding, role.megatron.context_parallel_size)
        if self.vision is not None and trainable:
            freeze_vision(gpt, role.megatron.freeze_vision_tower, role.megatron.freeze_projector)
        self.lora = None  # LoRAState when only adapters train (megatron.lora_r > 0)
        self.lora_base = None  # with LoRA: the checkpoint its frozen base was loaded from (checkpoint.lora_base)
        if trainable and role.megatron.lora_r:
            from .lora import apply_lora

            m = role.megatron
            self.lora = apply_lora(gpt, m.lora_r, m.lora_alpha, m.lora_dropout, m.lora_target_modules, m.seed)
            if head == "value" and getattr(gpt, "post_process", False):  # a new head: it trains with the adapters
                for p in gpt.output_layer.parameters():
                    p.requires_grad_(True)
        self.pp_last = ps.is_pipeline_last_stage(ignore_virtual=True)
        self.dp_size = ps.get_data_parallel_world_size()
        self.cp, self.cp_rank = ps.get_context_parallel_world_size(), ps.get_context_parallel_rank()
        self.optimizer = None
        self.scheduler = None
        self.route_replays: Optional[Dict] = None  # router replay's per-layer stand-ins, installed on first use
        self.replay_routes = True  # false: routes only compared with the router's own choice (the metric)
        # generate_config.batch_invariant: forwards in models/batch_invariant.py's numerics
        self.batch_invariant = False
        if trainable:
            self.model = [wrap_ddp(chunk, role.megatron.use_distributed_optimizer) for chunk in chunks]
            self.optimizer, self.scheduler = build_optimizer(self.model, self.config, role.megatron, total_steps)
        else:
            for chunk in chunks:
                chunk.eval()
                for p in chunk.parameters():
                    p.requires_grad_(False)
            self.model = chunks

    # ----- forward / backward -------------------------------------------------------------
    def _head_outputs(
        self, output: torch.Tensor, inp: ModelInput, temperature: float, with_entropy: bool, with_logits: bool
    ) -> Dict[str, torch.Tensor]:
        """Per-token outputs on the [B, S] grid from the model's output in the computed layout (with CP: this
        rank's positions, gathered over the CP group as per-token scalars)."""
        if self.head == "value":
            values = inp.gather(output.squeeze(-1).float())
            return {"values": inp.restore_next(values), "raw_values": inp.restore(values)}
        weight = output_weight(self.unwrapped())
        log_p, entropy = chunked_log_probs(
            output, weight, inp.labels, temperature, with_entropy, self.megatron.log_prob_chunk_size
        )
        out = {"log_probs": inp.restore_next(inp.gather(log_p))}
        if entropy is not None:
            out["entropy"] = inp.restore_next(inp.gather(entropy))
        if with_logits:  # full vocabulary, gathered over TP: for checks and generation only
            from megatron.core.tensor_parallel.mappings import gather_from_tensor_model_parallel_region

            logits = torch.nn.functional.linear(output, weight).float()
            out["logits"] = inp.restore(inp.gather(gather_from_tensor_model_parallel_region(logits)))
        return out

    def _loss_wrapper(
        self,
        mb: Batch,
        inp: ModelInput,
        loss_fn: Optional[LossFn],
        scale: float,
        temperature: float,
        with_entropy: bool,
        with_logits: bool,
        output: torch.Tensor,
    ):
        outputs = self._head_outputs(output, inp, temperature, with_entropy, with_logits)
        if loss_fn is None:  # forward only: hand the outputs back
            return output.sum() * 0.0, {k: v.detach() for k, v in outputs.items()}
        loss, metrics = loss_fn(outputs, mb)
        return loss * scale, {"loss": loss.detach().clone(), **metrics}

    def model_input(self, mb: Batch, trimmed: bool = False) -> ModelInput:
        """How a micro-batch is laid out for the model on this rank: packed valid tokens (remove_padding),
        rows without all-padding columns (``trimmed``) or the padded rows; then this CP rank's positions."""
        ids, mask = mb["input_ids"], mb["attention_mask"]
        if self.vision is not None:  # packed or the rows as they are, 3D positions, the micro-batch's images
            from ..families.vision.positions import micro_batch_images

            if self.remove_padding:
                inp = pack(ids, mask, multiple=self._sequence_multiple())
            else:
                inp = trim(ids, mask, multiple=self._sequence_multiple(), drop_padding_columns=False)
            positions, pixels, grids, filled = micro_batch_images(mb, *self.vision)
            return inp.with_images(positions, filled, pixel_values=pixels, image_grid_thw=grids)
        if self.remove_padding:  # valid tokens only, as one packed sequence (models/packing.py)
            inp = pack(ids, mask, multiple=self._sequence_multiple(), row_multiple=2 * self.cp if self.cp > 1 else 1)
        else:
            inp = trim(ids, mask, multiple=self._sequence_multiple(), drop_padding_columns=trimmed)
        return inp.split_context_parallel(self.cp, self.cp_rank) if self.cp > 1 else inp

    def _forward_step(self, loss_fn, scale, temperature, with_entropy, with_logits, trimmed, data_iterator, model):
        mb = next(data_iterator)
        inp = self.model_input(mb, trimmed)
        if "routed_experts" in mb or self.route_replays is not None:
            self._set_routes(inp, mb.get("routed_experts"))
        output = inp.run(model)
        return output, partial(self._loss_wrapper, mb, inp, loss_fn, scale, temperature, with_entropy, with_logits)

    def _set_routes(self, inp: ModelInput, routes: Optional[torch.Tensor]) -> None:
        """Router replay: the micro-batch's rollout routes ([B, S, L, k]) as every local MoE layer's target, in
        the order the layer sees its tokens; None: the routers choose on their own."""
        from megatron.core import parallel_state as ps

        from . import router_replay

        if self.route_replays is None:
            self.route_replays = router_replay.install(self.model)
        local = None
        if routes is not None:
            sp = self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1
            tp_rank = ps.get_tensor_model_parallel_rank()
            local = router_replay.routes_in_computed_layout(inp, routes, self.cp_rank, tp_rank, sp)
        router_replay.set_targets(self.route_replays, local, self.replay_routes)

    def _sequence_multiple(self) -> int:
        """What a computed sequence length must be a multiple of: TP with sequence parallelism, 2 x CP."""
        sp = self.config.tensor_model_parallel_size if self.config.sequence_parallel else 1
        return sp * (2 * self.cp if self.cp > 1 else 1)

    def _micro_batches(
        self, batch: Batch, micro_batch_size: int, token_budget: Optional[int]
    ) -> Tuple[List[Batch], Optional[torch.Tensor]]:
        """Fixed-size row slices, or (with ``token_budget``) micro-batches of at most that many tokens; the
        second value is the row order of the concatenated micro-batches (None: the batch's own)."""
        if not token_budget:
            return split_micro_batches(batch, micro_batch_size), None
        lengths = batch["attention_mask"].sum(1).tolist()
        groups = token_budget_groups(lengths, token_budget, packed=self.remove_padding)
        order = torch.as_tensor(np.concatenate(groups))
        return [{k: v[torch.as_tensor(g)] for k, v in batch.items()} for g in groups], order

    def _interleavable(self, micro: List[Batch], forward_only: bool) -> List[Batch]:
        """VPP: megatron's interleaved schedule takes a multiple of PP micro-batches. A forward pass repeats its
        last one (outputs dropped); an update must come whole (rl_config checks it)."""
        pp = self.config.pipeline_model_parallel_size
        if len(self.model) == 1 or len(micro) % pp == 0:
            return micro
        if not forward_only:
            raise ValueError(f"{len(micro)} micro-batches: an interleaved pipeline (VPP) updates a multiple of PP {pp}")
        return micro + [micro[-1]] * (pp - len(micro) % pp)

    def _run(
        self,
        batch: Batch,
        micro_batch_size: int,
        loss_fn: Optional[LossFn],
        forward_only: bool,
        temperature: float = 1.0,
        with_entropy: bool = True,
        with_logits: bool = False,
        token_budget: Optional[int] = None,
    ) -> Tuple[List[Dict], Optional[torch.Tensor]]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        batch = {k: v.to(self.device) for k, v in batch.items()}
        micro, order = self._micro_batches(batch, micro_batch_size, token_budget)
        count = len(micro)
        micro = self._interleavable(micro, forward_only)
        # megatron divides each micro-batch's loss by their number, DP averages the gradients: undone here
        scale = float(len(micro) * (1 if forward_only else self.dp_size))
        fwd_bwd = get_forward_backward_func()
        # the interleaved schedule reads the micro-batches once per model chunk
        data = [iter(micro) for _ in self.model] if len(self.model) > 1 else iter(micro)
        with batch_invariant(self.batch_invariant):
            stores = fwd_bwd(
                forward_step_func=partial(
                    self._forward_step, loss_fn, scale, temperature, with_entropy, with_logits, token_budget is not None
                ),
                data_iterator=data,
                model=self.model,
                num_microbatches=len(micro),
                seq_length=round_up(batch["input_ids"].shape[1], self._sequence_multiple()),  # what trim widens to
                micro_batch_size=micro_batch_size,
                forward_only=forward_only,
            )
        return stores[:count], order

    @torch.no_grad()
    def forward(
        self,
        batch: Batch,
        micro_batch_size: int,
        temperature: float = 1.0,
        with_entropy: bool = False,
        with_logits: bool = False,
        token_budget: Optional[int] = None,
    ) -> Dict[str, torch.Tensor]:
        """Head outputs for the whole batch (in its row order), returned on every rank of the model-parallel
        group. ``token_budget``: micro-batches of at most that many tokens instead of ``micro_batch_size``
        rows."""
        for chunk in self.model:
            chunk.eval()
        stores, order = self._run(
            batch, micro_batch_size, None, True, temperature, with_entropy, with_logits, token_budget
        )
        outputs = None
        if self.pp_last:
            outputs = {k: torch.cat([s[k] for s in stores]) for k in stores[0]}
            if order is not None:
                outputs = {k: restore_order(v, order) for k, v in outputs.items()}
        return broadcast_from_last_stage(outputs, self._comm_device())

    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        micro_batch_size: int,
        temperature: float = 1.0,
        token_budget: Optional[int] = None,
    ) -> StepResult:
        """One optimizer step over ``batch`` (one mini-batch on this DP rank); ``token_budget`` as in
        ``forward``. The gradient does not depend on how the rows are split into micro-batches."""
        if not self.trainable:
            raise RuntimeError(f"{self.role.name} is frozen: it has no optimizer")
        for chunk in self.model:
            chunk.train()
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()
        stores, _ = self._run(batch, micro_batch_size, loss_fn, False, temperature, True, token_budget=token_budget)
        fuse_adam_steps(self.optimizer)
        losses_finite = all(math.isfinite(float(s["loss"])) for s in stores if "loss" in s)
        stepped, grad_norm, nonfinite = step_unless_nonfinite(self.optimizer, losses_finite, self._everywhere)
        if stepped:
            self.nonfinite_streak = 0
            self.scheduler.step(increment=1)
        else:  # the weights, optimizer state and lr stay as they were
            for chunk in self.model:
                chunk.zero_grad_buffer()
            self.optimizer.zero_grad()
            self.nonfinite_streak += int(nonfinite)
        metrics = reduce_metrics(stores, self.pp_last, self.dp_size, self._comm_device())
        return StepResult(
            loss=metrics.pop("loss", float("nan") if not stepped else 0.0),
            grad_norm=grad_norm,
            lr=self.current_lr(),
            update_successful=stepped,
            metrics=metrics,
            skipped=not stepped,
        )

    def all_finite(self) -> bool:
        """Whether every weight of the engine is finite on every rank of the role's world."""
        finite = all(bool(torch.isfinite(t).all()) for _, t in self.named_weights() if t.is_floating_point())
        return self._everywhere([finite])[0]

    def _everywhere(self, holds: List[bool]) -> List[bool]:
        """Each flag of ``holds``: whether it is true on every rank of the role's world (one collective, which
        every rank calls)."""
        flags = torch.tensor([0.0 if h else 1.0 for h in holds], device=self._comm_device())
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [flag == 0.0 for flag in flags.tolist()]

    def current_lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"]) if self.optimizer else 0.0

    def _comm_device(self) -> torch.device:
        return self.acc.comm_device(self.device)
