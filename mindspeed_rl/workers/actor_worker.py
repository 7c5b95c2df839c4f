"""The integrated actor: policy training, the rollout engine and the frozen reference in one process.

Train -> infer: the actor's shards are streamed into the rollout engine (resharding), then the
training state is offloaded as generate_config says. Infer -> train: the engine is offloaded and
the training state onloaded. The reference lives on host between its forward passes.
"""
from __future__ import annotations

import time
from typing import Dict, List, Optional, Sequence

import torch

from ..algorithms import aggregate_token_mean, entropy_loss, kl_penalty, policy_loss
from ..config_cls.generate_config import GenerateConfig, SamplingConfig
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from .base_worker import MegatronWorker, response_part, train_on_mini_batches


class IntegratedActorWorker(MegatronWorker):
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, role: RoleConfig,
                 rl: RLConfig, gen: GenerateConfig, total_steps: int, eos_token_id: Optional[int],
                 pad_token_id: int, vocab_size: int, threads: int):
        m = role.megatron
        super().__init__(rank, world_size, master_addr, master_port, m.tensor_model_parallel_size,
                         m.pipeline_model_parallel_size, m.seed, threads)
        from ..accelerator import get_accelerator
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader
        from ..rollout.factory import make_rollout_engine

        self.role, self.rl, self.gen = role, rl, gen
        self.actor = MegatronEngine(role, head="lm", trainable=True, total_steps=total_steps)
        self.ref = MegatronEngine(role, head="lm", trainable=False)
        self.actor_offload, self.ref_offload = Offloader(self.actor), Offloader(self.ref)
        self.kind = get_accelerator().kind
        self.rollout = make_rollout_engine(role.model, gen, self.kind, eos_token_id, pad_token_id, vocab_size,
                                           seed=gen.sampling_config.seed, bf16=m.bf16)

    # ----- weights --------------------------------------------------------------------------------
    def init_weights(self, load: Optional[str], finetune: bool, load_optim: bool, load_rng: bool,
                     ref_load: Optional[str]) -> Dict:
        """Actor from ``load`` (or its seeded init); the reference from the original weights.

        The reference is, in order: ``ref_load`` (integrated_mode_config.ref_model_load_path); on a resume
        (finetune false), the path the first run started from (recorded in the checkpoint); the
        actor's weights before any checkpoint is loaded (its seeded init, or a finetune load).
        """
        from ..checkpoint.engine_io import load_engine, load_weights_only

        payload: Dict = {}
        if load and finetune:
            payload = load_weights_only(self.actor, load)
            self.ref.load_weights({k: v.detach().clone() for k, v in self.actor.named_weights()})
        else:
            self.ref.load_weights({k: v.detach().clone() for k, v in self.actor.named_weights()})
            if load:
                payload = load_engine(self.actor, load, load_optim, load_rng)
        origin = ref_load or (payload.get("trainer_state") or {}).get("ref_from")
        if origin:
            load_weights_only(self.ref, origin)
        self.ref_offload.offload(grads=False, optimizer=False)  # the reference waits on host
        return {k: v for k, v in payload.items() if k in ("iteration", "trainer_state")}

    def save(self, ckpt_dir: str, iteration: int, extra: Dict, save_optim: bool, save_rng: bool) -> None:
        from ..checkpoint.engine_io import save_engine

        save_engine(self.actor, ckpt_dir, iteration, extra, save_optim, save_rng)

    # ----- rollout ---------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], n: int, seed: int,
                 sampling: Optional[SamplingConfig] = None) -> Dict:
        """Sync weights into the engine, sample n responses per prompt, hand the devices back."""
        from ..rollout.resharding import iter_full_weights

        t0 = time.perf_counter()
        self.rollout.onload()
        self.rollout.update_weights(iter_full_weights(self.actor))
        self.actor_offload.offload(params=self.gen.offload_train_param, grads=self.gen.offload_train_grad,
                                   optimizer=self.gen.offload_train_optimizer)
        t_to_infer = time.perf_counter() - t0
        t0 = time.perf_counter()
        outputs = self.rollout.generate(prompts, sampling or self.gen.sampling_config, n, seed) if prompts else []
        t_generate = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.rollout.offload()
        self.actor_offload.onload()
        t_to_train = time.perf_counter() - t0
        return {"outputs": [(o.prompt_index, o.response_ids, o.logprobs, o.finish_reason) for o in outputs],
                "timing/resharding_to_infer": t_to_infer, "timing/resharding_to_train": t_to_train,
                "timing/generate": t_generate}

    # ----- forward passes -----------------------------------------------------------------------------
    def compute_log_prob(self, batch: Dict[str, torch.Tensor], which: str = "actor") -> Dict:
        """Log-probs of the response tokens under the actor ("old") or the reference."""
        temperature = self.gen.sampling_config.temperature or 1.0
        timing = {}
        if which == "ref":
            t0 = time.perf_counter()
            self.ref_offload.onload()
            timing["timing/ref_onload"] = time.perf_counter() - t0
            engine, mbs = self.ref, self.rl.ref_forward_micro_batch_size
        else:
            engine, mbs = self.actor, self.rl.actor_forward_micro_batch_size
        width = int(batch.pop("prompt_width").item())
        out = engine.forward(batch, mbs, temperature=temperature)
        if which == "ref":
            t0 = time.perf_counter()
            self.ref_offload.offload(grads=False, optimizer=False)
            timing["timing/ref_offload"] = time.perf_counter() - t0
        part = response_part(out["log_probs"], width, batch["response_mask"]) if self.is_output_rank else None
        return {"log_probs": part, **timing}

    # ----- update ----------------------------------------------------------------------------------------
    def update(self, mini_batches: List[Dict[str, torch.Tensor]], kl_coef: float) -> Dict[str, float]:
        """One optimizer step per mini-batch (this DP rank's share of it); averaged metrics."""
        rl = self.rl

        def make_loss(width: int, normaliser: float):
            def loss_fn(outputs, micro):
                mask = micro["response_mask"].float()
                log_prob = response_part(outputs["log_probs"], width, mask)
                old = micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach()
                pg, m = policy_loss(log_prob, old, micro["advantages"], mask, rl.clip_ratio, rl.clip_ratio_c,
                                    normaliser)
                entropy = entropy_loss(response_part(outputs["entropy"], width, mask), mask, normaliser)
                loss = pg - rl.entropy_coeff * entropy
                kl_loss = torch.zeros((), device=pg.device)
                if not rl.use_kl_in_reward and "ref_log_probs" in micro:
                    kl_loss = aggregate_token_mean(kl_penalty(log_prob, micro["ref_log_probs"], rl.kl_penalty),
                                                   mask, normaliser)
                    loss = loss + kl_coef * kl_loss
                return loss, {"actor/pg_loss": float(pg), "actor/entropy": float(entropy),
                              "actor/kl_loss": float(kl_loss), "actor/pg_clipfrac": float(m["pg_clipfrac"]),
                              "actor/ppo_kl": float(m["ppo_kl"])}
            return loss_fn

        return train_on_mini_batches(self.actor, mini_batches, make_loss, self.role.megatron.micro_batch_size,
                                     "actor", self.gen.sampling_config.temperature or 1.0)

    def shutdown(self) -> None:
        self.rollout.shutdown()
        super().shutdown()
