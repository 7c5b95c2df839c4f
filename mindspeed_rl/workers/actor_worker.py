"""The integrated actor: policy training, the rollout engine and the frozen reference in one process.

Train -> infer: the actor's shards are streamed into the rollout engine (resharding), then the
training state is offloaded as generate_config says. Infer -> train: the engine is offloaded and
the training state onloaded. The reference lives on host between its forward passes.

In the disaggregated layout the actor has no engine: rank 0 streams the same full weights to the rollout
workers over a weight channel (``push_weights``).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Dict, List, Optional

import torch

from ..algorithms.kl import kl_penalty
from ..algorithms.losses import Clip, LossScale, aggregate, entropy_loss, policy_loss
from ..config_cls.generate_config import GenerateConfig
from ..config_cls.rl_config import RLConfig
from ..config_cls.run_config import RoleConfig, captures_routes
from ..features.algorithm import resolve_algorithm
from ..protocol import (
    ACTOR_INPUTS,
    MODEL_INPUTS,
    Experience,
    ForwardAnswer,
    LoadedState,
    MiniBatch,
    RankLayout,
    RolloutRequest,
    RolloutResult,
    WorldSpec,
    response_part,
)
from .base_worker import MegatronWorker, shares_cores, token_budget, train_on_mini_batches
from .profiling import StageProfiler, profiled
from .reference import ReferencePolicy


class IntegratedActorWorker(MegatronWorker):
    def __init__(
        self,
        world: WorldSpec,
        role: RoleConfig,
        rl: RLConfig,
        gen: GenerateConfig,
        total_steps: int,
        eos_token_id: Optional[int],
        pad_token_id: int,
        with_engine: bool = True,
    ):
        m = role.megatron
        super().__init__(world, role)
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader
        from ..rollout.engines.factory import make_rollout_engine

        self.role, self.rl, self.gen = role, rl, gen
        self.algorithm = resolve_algorithm(rl)
        self.actor = MegatronEngine(
            role, head="lm", trainable=True, total_steps=total_steps, remove_padding=rl.use_remove_padding
        )
        # the frozen reference exists only when the algorithm uses a KL term (workers/reference.py)
        self.reference = (
            ReferencePolicy(role, self.actor, rl.use_remove_padding, park_on_host=True)
            if self.algorithm.use_reference
            else None
        )
        self.actor.replay_routes = rl.router_replay == "R3"  # "compare": routes counted against, not replayed
        self.actor.batch_invariant = gen.batch_invariant
        self.actor_offload = Offloader(self.actor)
        self.kind = self.acc.kind
        self.rollout = (
            make_rollout_engine(
                role.model,
                gen,
                self.kind,
                eos_token_id,
                pad_token_id,
                seed=gen.sampling_config.seed,
                bf16=m.bf16,
                capture_routes=captures_routes(rl, gen),
                processor_dir=m.tokenizer_name_or_path,
            )
            if with_engine
            else None
        )
        # engines are blocks of contiguous ranks of this world (vLLM's external-launcher split)
        self.engine_size = self.rollout.tensor_parallel_size if with_engine else 0
        self.engine_index, self.engine_rank = divmod(world.rank, self.engine_size) if with_engine else (-1, -1)
        self.engine_version: Optional[int] = None  # the policy version the engine holds (None: unknown)
        self.weights_out = None  # rank 0's channels to the rollout engines (disaggregated layout): a WeightFanOut
        self.profiling = StageProfiler(self.acc, "actor", world.rank, role.profiler)

    def layout(self) -> RankLayout:
        return dataclasses.replace(
            super().layout(), engine=self.engine_index, engine_rank=self.engine_rank, engine_size=self.engine_size
        )

    # ----- weights --------------------------------------------------------------------------------
    def init_weights(
        self,
        load: Optional[str],
        finetune: bool,
        load_optim: bool,
        load_rng: bool,
        ref_load: Optional[str],
        iteration: Optional[int] = None,
    ) -> LoadedState:
        """Actor from ``load`` (or its seeded init); the reference from the original weights.

        The reference is, in order: ``ref_load`` (integrated_mode_config.ref_model_load_path); on a resume
        (finetune false), the path the first run started from (recorded in the checkpoint); the
        actor's weights before any checkpoint is loaded (its seeded init, or a finetune load).
        """
        from ..checkpoint.engine_io import load_engine, load_weights_only

        payload: Dict = {}
        if load and finetune:
            payload = load_weights_only(self.actor, load)
        initial = self.reference.initial_weights() if self.reference is not None else None
        if load and not finetune:
            payload = load_engine(self.actor, load, load_optim, load_rng, iteration)
        # the run's state only on a resume: a finetune start begins at iteration 0 with its own data position
        resumed = dict(payload.get("trainer_state") or {}) if load and not finetune else {}
        if self.reference is not None:
            self.reference.load(initial, ref_load or resumed.get("ref_from"))
        self.engine_version = None
        return LoadedState(int(payload.get("iteration") or 0), resumed)

    def save(self, ckpt_dir: str, iteration: int, extra: Dict, save_optim: bool, save_rng: bool) -> Optional[str]:
        """The checkpoint of ``iteration``; with save_hf also its HF folder (the path, else None)."""
        from ..checkpoint.engine_io import save_engine, save_hf_copy

        save_engine(self.actor, ckpt_dir, iteration, extra, save_optim, save_rng)
        return save_hf_copy(self.actor, ckpt_dir, iteration)

    # ----- disaggregated layout: weights to the rollout workers ------------------------------------
    def open_weight_channel(self, host, port, size, native_port=None, engine: int = 0, timeout_s=1800.0) -> None:
        """Rank 0 opens its channel to rollout ``engine`` as the sender (the other ranks only take part in
        gathering); with ``native_port``, through vLLM's weight-transfer engine, converting each piece as vLLM loads
        it. ``timeout_s``: how long a send may wait for that engine."""
        if self.rank != 0:
            return
        from ..rollout.weights.weight_transfer import VllmNativeChannel, WeightChannel, WeightFanOut

        self.weights_out = self.weights_out or WeightFanOut()
        comm = self.acc.comm_device(self.actor.device)
        if native_port is None:
            self.weights_out.add(engine, WeightChannel(host, port, 0, size, comm, timeout_s))
            return
        from ..rollout.engines.vllm_engine import vllm_named

        model, dtype, backend = self.role.model, self.gen.dtype, self.acc.vllm_weight_transfer_backend()
        prepare = lambda piece: vllm_named(piece, model, dtype)  # noqa: E731
        channel = VllmNativeChannel(
            host, port, 0, size, comm, backend, native_port, timeout_s=timeout_s, prepare=prepare
        )
        self.weights_out.add(engine, channel)

    def close_weight_channel(self, engine: int) -> None:
        """Forget the channel to an engine taken out of service (rank 0)."""
        if self.weights_out is not None:
            self.weights_out.drop(engine)

    @profiled("actor_resharding")
    def push_weights(self, engines: Optional[List[int]] = None) -> Dict:
        """Gather the full weights from every TP/PP/EP shard (all ranks) and stream them to the rollout engines
        ``engines`` (None: all; rank 0); ``failed`` names the engines whose stream broke."""
        from ..rollout.weights.resharding import iter_full_weights

        pieces = iter_full_weights(self.actor)
        if self.weights_out is not None:
            return self.weights_out.send(pieces, engines)
        for _ in pieces:
            pass
        return {}

    # ----- rollout ---------------------------------------------------------------------------------
    @profiled("actor_generate")
    def generate(self, request: RolloutRequest, version: Optional[int] = None) -> RolloutResult:
        """Sample the request's n responses per prompt (sample i seeded ``seed + i``) with the weights of policy
        ``version``:
        the actor's weights are resharded into the engine unless it already holds that version (None: always),
        then the devices are handed back. Every rank of an engine must receive the same prompts; only the
        engine's first rank returns the outputs."""
        from ..rollout.weights.resharding import iter_full_weights

        if self.rollout is None:
            raise RuntimeError(
                "this actor has no rollout engine (disaggregated layout): generate on the rollout workers"
            )
        request = request.with_sampling(self.gen.sampling_config)
        t0 = time.perf_counter()
        self.rollout.onload()
        if version is None or version != self.engine_version:
            self.rollout.update_weights(iter_full_weights(self.actor))
            self.engine_version = version
        self.actor_offload.offload(
            params=self.gen.offload_train_param,
            grads=self.gen.offload_train_grad,
            optimizer=self.gen.offload_train_optimizer,
        )
        t_to_infer = time.perf_counter() - t0
        t0, started = time.perf_counter(), time.time()
        outputs = self.rollout.generate(request) if request.prompts or self.rollout.generates_in_step else []
        t_generate = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.rollout.offload()
        self.actor_offload.onload()
        t_to_train = time.perf_counter() - t0
        return RolloutResult(
            rank=self.rank,
            engine=self.engine_index,
            request_digest=request.digest(version),
            outputs=outputs if self.engine_rank == 0 else None,
            timing={
                "timing/resharding_to_infer": t_to_infer,
                "timing/resharding_to_train": t_to_train,
                "timing/generate": t_generate,
            },
            started=started,
        )

    # ----- forward passes -----------------------------------------------------------------------------
    @shares_cores
    @profiled(lambda rows, which="actor": "reference_compute_log_prob" if which == "ref" else "actor_compute_log_prob")
    def compute_log_prob(self, rows: Experience, which: str = "actor") -> ForwardAnswer:
        """Log-probs [B, R] of the response tokens under the actor ("old") or the reference."""
        temperature = self.gen.sampling_config.temperature or 1.0
        # router replay: the actor's forwards route as the rollout did (the reference's own routes stand)
        inputs = self.inputs(rows, ACTOR_INPUTS if which == "actor" else MODEL_INPUTS)
        budget = token_budget(self.rl, which)
        if which == "ref":
            assert self.reference is not None, "the reference's log-probs asked of an algorithm without a reference"
            with self.reference.in_use() as (engine, timing):
                out = engine.forward(
                    inputs, self.rl.ref_forward_micro_batch_size, temperature=temperature, token_budget=budget
                )
        else:
            mbs, timing = self.rl.actor_forward_micro_batch_size, {}
            out = self.actor.forward(inputs, mbs, temperature=temperature, token_budget=budget)
        part = response_part(out["log_probs"], rows.prompt_width, rows.response_width) if self.is_output_rank else None
        return ForwardAnswer(part, timing, self.route_metrics() if which == "actor" else {})

    def route_metrics(self) -> Dict[str, float]:
        """Router replay: how often the actor's own routers would have chosen other experts than the rollout's,
        over the whole actor world (each token counted once: by every TP rank's slice with sequence parallelism,
        else by TP rank 0); the counts start again."""
        if self.actor.route_replays is None:
            return {}
        from ..models.router_replay import mismatch_metrics, take_mismatch

        counts = torch.zeros(self.role.model.num_layers, 2, dtype=torch.float64)
        taken = take_mismatch(self.actor.route_replays)
        if self.actor.config.sequence_parallel or self.tp_rank == 0:
            for number, differ, tokens in taken:
                counts[number - 1] = torch.tensor([differ, tokens], dtype=torch.float64)
        counts = counts.to(self.actor.device)
        torch.distributed.all_reduce(counts)
        return mismatch_metrics(counts.cpu())

    # ----- update ----------------------------------------------------------------------------------------
    @shares_cores
    @profiled("actor_update")
    def update(self, mini_batches: List[MiniBatch], kl_coef: float) -> Dict[str, float]:
        """One optimizer step per mini-batch (this DP rank's share of it); averaged metrics.

        loss = policy loss (the registry's, aggregated by loss_agg_mode) - entropy_coeff x entropy
               + beta x KL(actor || reference)   (when the KL is in the loss, not in the reward)
        """
        rl, plan = self.rl, self.algorithm
        clip = Clip(plan.clip_low, plan.clip_high, plan.clip_dual, plan.tau_pos, plan.tau_neg)
        mode = plan.loss_agg_mode

        def make_loss(rows: Experience, scale: LossScale):
            width, length = rows.prompt_width, rows.response_width
            per_token = LossScale(scale.tokens, 1.0)  # token means for the metrics

            def loss_fn(outputs, micro):
                mask = micro["loss_mask"]
                log_prob = response_part(outputs["log_probs"], width, length)
                old = micro["old_log_probs"] if "old_log_probs" in micro else log_prob.detach()
                pg, m = policy_loss(
                    plan.policy_loss,
                    log_prob,
                    old,
                    micro["advantages"],
                    mask,
                    clip,
                    mode,
                    scale,
                    micro.get("rollout_is_weights"),
                )
                entropy = response_part(outputs["entropy"], width, length)
                loss = pg - rl.entropy_coeff * entropy_loss(entropy, mask, mode, scale) if rl.entropy_coeff else pg
                kl_mean = torch.zeros((), device=pg.device)
                if plan.kl_in_loss:
                    kl = kl_penalty(log_prob, micro["ref_log_probs"], rl.kl_penalty)
                    loss = loss + kl_coef * aggregate(kl, mask, mode, scale)
                    kl_mean = aggregate(kl.detach(), mask, "token-mean", per_token)
                return loss, {
                    "actor/pg_loss": float(pg),
                    "actor/entropy": float(aggregate(entropy.detach(), mask, "token-mean", per_token)),
                    "actor/kl_loss": float(kl_mean),
                    "actor/pg_clipfrac": float(m["pg_clipfrac"]),
                    "actor/pg_clipfrac_lower": float(m["pg_clipfrac_lower"]),
                    "actor/ppo_kl": float(m["ppo_kl"]),
                }

            return loss_fn

        metrics = train_on_mini_batches(
            self.actor,
            mini_batches,
            make_loss,
            self.role.megatron.micro_batch_size,
            "actor",
            self.gen.sampling_config.temperature or 1.0,
            token_budget(rl, "update"),
            self.image_encoder,
        )
        if self.actor.route_replays is not None:  # the update replays the routes; its counts are not reported
            from ..models.router_replay import take_mismatch

            take_mismatch(self.actor.route_replays)
        return metrics

    def shutdown(self) -> None:
        """The run's end: the process is killed next."""
        if self.rollout is not None:
            self.rollout.release_at_exit()
        self.weights_out = None
        super().shutdown()
