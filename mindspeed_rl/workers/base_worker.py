"""What every Megatron worker does first: its torch.distributed world, threads, seeds."""

from __future__ import annotations

import functools
import inspect
import os
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import torch

from ..config_cls.megatron_config import mindspeed_argv
from ..config_cls.ppo_config import RoleConfig
from ..config_cls.rl_config import RLConfig
from ..protocol import MODEL_INPUTS, Experience, LoadedState, MiniBatch, RankLayout, WorldSpec
from ..protocol.experience_rows import image_fields
from .profiling import StageProfiler


def start_worker_process(world: WorldSpec):
    """What every worker process does first: its output routed (rl_config.library_logs) before vLLM or megatron
    print anything, its rank's environment and thread count, the device's process settings, then its
    torch.distributed world (the group's own master port). Returns the process's accelerator."""
    from ..utils.library_logs import route_process_output

    route_process_output()
    os.environ.update(
        {
            "RANK": str(world.rank),
            "WORLD_SIZE": str(world.world_size),
            "LOCAL_RANK": str(world.rank),
            "MASTER_ADDR": world.master_addr,
            "MASTER_PORT": str(world.master_port),
            "OMP_NUM_THREADS": str(world.threads),
        }
    )
    torch.set_num_threads(max(1, world.threads))
    # megatron-core imports wandb, where installed, for loggers of its own that no worker uses (the driver logs,
    # rl_config.use_wandb): 0.6 s of every worker's start. Absent here, megatron takes its path without it.
    sys.modules.setdefault("wandb", None)
    from ..accelerator import get_accelerator
    from ..utils import dist

    accelerator = get_accelerator()
    accelerator.prepare_process()
    dist.init_distributed(
        world.rank, world.world_size, world.master_addr, world.master_port, local_rank=accelerator.local_rank()
    )
    return accelerator


def shares_cores(method: Callable) -> Callable:
    """A worker method another role's may run beside (``rl_config.blocking: false``): ``ways``, the calls running at
    once on these devices (1: alone), is the accelerator's to act on (on CPU, a share of the threads)."""

    @functools.wraps(method)
    def inner(self, *args, ways: int = 1, **kwargs):
        with self.acc.sharing_cores(ways):
            return method(self, *args, **kwargs)

    # Ray checks a call's arguments against the signature of the unwrapped method, which has no ``ways``: this one
    # is not unwrapped, and its signature is the method's with ``ways``
    signature = inspect.signature(method)
    extra = inspect.Parameter("ways", inspect.Parameter.KEYWORD_ONLY, default=1, annotation=int)
    del inner.__wrapped__  # type: ignore[attr-defined]
    inner.__signature__ = signature.replace(parameters=[*signature.parameters.values(), extra])  # type: ignore[attr-defined]
    return inner


class MegatronWorker:
    """One rank of a role's own torch.distributed world (own master port), with the role's model parallel
    groups; ``seed_offset`` keeps the roles' random streams apart."""

    def __init__(self, world: WorldSpec, role: RoleConfig, seed_offset: int = 0):
        from ..utils import dist

        self.acc = start_worker_process(world)
        self.rank, self.world_size = world.rank, world.world_size
        m = role.megatron
        if self.acc.runs_mindspeed:  # before MindSpeed patches megatron-core (init_model_parallel imports it)
            self.acc.use_mindspeed_switches(mindspeed_argv(m))
        dist.init_model_parallel(
            m.tensor_model_parallel_size,
            m.pipeline_model_parallel_size,
            seed=m.seed + seed_offset,
            ep=m.expert_model_parallel_size,
            cp=m.context_parallel_size,
            vpp=m.virtual_stages(role.model.num_layers),
        )
        from megatron.core import parallel_state as ps

        self.tp_rank = ps.get_tensor_model_parallel_rank()
        self.pp_rank = ps.get_pipeline_model_parallel_rank()
        self.dp_rank = ps.get_data_parallel_rank()
        self.dp_size = ps.get_data_parallel_world_size()
        # one rank per data-parallel replica hands back outputs (CP ranks hold the same gathered outputs)
        self.is_output_rank = (
            self.tp_rank == 0 and ps.get_context_parallel_rank() == 0 and ps.is_pipeline_last_stage(ignore_virtual=True)
        )
        self.profiling = StageProfiler(self.acc, "", self.rank, None)  # a role with profiler_config sets its own
        self._images = (m.tokenizer_name_or_path, None) if role.model.vision_config else None

    @property
    def image_encoder(self):
        """A vision-language role's rows carry their prompts' stored images, turned into pixels here (each prompt's
        once: the encoder's cache); made at the first rows with images. None for a text model."""
        if self._images is None:
            return None
        folder, encoder = self._images
        if encoder is None:
            from ..datasets.images import ImageEncoder

            encoder = ImageEncoder(folder)
            self._images = (folder, encoder)
        return encoder

    def inputs(self, rows: Experience, names: Iterable[str] = MODEL_INPUTS) -> Dict[str, torch.Tensor]:
        return model_inputs(rows, names, self.image_encoder if rows.images is not None else None)

    def profile_at(self, iteration: int, save_dir: str) -> None:
        """The iteration about to run and where profiled stages write (profiler_config)."""
        self.profiling.at(iteration, save_dir)

    def layout(self) -> RankLayout:
        return RankLayout(
            rank=self.rank,
            dp_rank=self.dp_rank,
            dp_size=self.dp_size,
            tp_rank=self.tp_rank,
            pp_rank=self.pp_rank,
            output=bool(self.is_output_rank),
        )

    def shutdown(self) -> None:
        from ..utils import dist

        dist.destroy()


class FrozenModelWorker(MegatronWorker):
    """A role that only runs forwards, with weights it loads (the reward model, the distillation teacher): its
    engine with the class's ``head``, and with ``offload_when_idle`` its weights on host between forwards."""

    head = "lm"
    seed_offset = 0

    def __init__(self, world: WorldSpec, role: RoleConfig, rl: RLConfig, offload_when_idle: bool = False):
        super().__init__(world, role, self.seed_offset)
        from ..models.engine import MegatronEngine
        from ..models.offload import Offloader

        self.role, self.rl = role, rl
        self.model = MegatronEngine(role, head=self.head, trainable=False, remove_padding=rl.use_remove_padding)
        self.offloader = Offloader(self.model) if offload_when_idle else None

    def init_weights(self, load: str) -> LoadedState:
        from ..checkpoint.engine_io import load_weights_only

        load_weights_only(self.model, load)
        if self.offloader is not None:
            self.offloader.offload(grads=False, optimizer=False)
        return LoadedState()

    def forward_rows(self, rows: Experience, micro_batch_size: int) -> Tuple[Dict[str, torch.Tensor], Dict]:
        """The engine's outputs over ``rows`` (token budget: rl_config's "ref" one), the weights onloaded around
        it where they wait on host; and the seconds of that, as timing/<role>_onload and _offload."""
        timing = {}
        if self.offloader is not None:
            t0 = time.perf_counter()
            self.offloader.onload()
            timing[f"timing/{self.role.name}_onload"] = time.perf_counter() - t0
        out = self.model.forward(self.inputs(rows), micro_batch_size, token_budget=token_budget(self.rl, "ref"))
        if self.offloader is not None:
            t0 = time.perf_counter()
            self.offloader.offload(grads=False, optimizer=False)
            timing[f"timing/{self.role.name}_offload"] = time.perf_counter() - t0
        return out, timing


class StageWorker(MegatronWorker):
    """A single-role stage's rank (reward model, SFT, DPO): one trainable engine, ``self.model``, started and saved
    as every training role is."""

    model: Any

    def init_weights(
        self, load: Optional[str], finetune: bool, load_optim: bool, load_rng: bool, iteration: Optional[int] = None
    ) -> LoadedState:
        return load_trainable(self.model, load, finetune, load_optim, load_rng, iteration)

    def save(self, ckpt_dir: str, iteration: int, extra: Dict, save_optim: bool, save_rng: bool) -> Optional[str]:
        return save_trainable(self.model, ckpt_dir, iteration, extra, save_optim, save_rng)

    def step_metrics(self, step, prefix: str) -> Dict[str, float]:
        """An optimizer step's figures under ``prefix`` (the loss, its grad norm, lr, skip and non-finite streak
        the guards read) with the loss function's own metrics."""
        return {
            f"{prefix}/loss": step.loss,
            **step.metrics,
            f"{prefix}/grad_norm": step.grad_norm,
            f"{prefix}/lr": step.lr,
            f"{prefix}/skipped_steps": float(step.skipped),
            f"{prefix}/nonfinite_streak": float(self.model.nonfinite_streak),
        }


def load_trainable(
    engine, load: Optional[str], finetune: bool, load_optim: bool, load_rng: bool, iteration: Optional[int] = None
) -> LoadedState:
    """A training engine's start: its seeded init without ``load``; the weights only with ``finetune``; else the
    whole checkpoint of ``iteration`` (default the latest) with the run's state saved beside it."""
    from ..checkpoint.engine_io import load_engine, load_weights_only

    payload: Dict = {}
    if load:
        payload = (
            load_weights_only(engine, load) if finetune else load_engine(engine, load, load_optim, load_rng, iteration)
        )
    return LoadedState(int(payload.get("iteration") or 0), dict(payload.get("trainer_state") or {}))


def save_trainable(
    engine, ckpt_dir: str, iteration: int, extra: Dict, save_optim: bool, save_rng: bool
) -> Optional[str]:
    """The checkpoint of ``iteration``; with save_hf also its HF folder (the --orm form for a value head), whose
    path is returned."""
    from ..checkpoint.engine_io import save_engine, save_hf_copy

    save_engine(engine, ckpt_dir, iteration, extra, save_optim, save_rng)
    return save_hf_copy(engine, ckpt_dir, iteration)


def token_budget(rl, work: str) -> Optional[int]:
    """The micro-batch token budget of ``work`` ("ref", "actor" or "update": rl_config's
    <work>_max_packing_token_size) with use_dynamic_bsz, else None (micro-batches by row count)."""
    return getattr(rl, f"{work}_max_packing_token_size") if rl.use_dynamic_bsz else None


def model_inputs(rows: Experience, names: Iterable[str], encoder=None) -> Dict[str, torch.Tensor]:
    """The tensors the engine takes of ``rows``: the named fields and, for rows with images, their pixels and grids
    (IMAGE_INPUTS) decoded here by ``encoder`` (datasets/images.ImageEncoder)."""
    inputs = rows.tensors(names)
    if rows.images is not None and encoder is not None:
        inputs.update(image_fields([encoder.encode(blob) for blob in rows.images]))
    return inputs


def train_on_mini_batches(
    engine,
    mini_batches: List[MiniBatch],
    make_loss: Callable,
    micro_batch_size: int,
    prefix: str,
    temperature: float = 1.0,
    token_budget: Optional[int] = None,
    encoder=None,
) -> Dict[str, float]:
    """One optimizer step per mini-batch (skipped when its loss or gradient is not finite);
    ``make_loss(rows, scale)`` builds each step's loss.

    Each mini-batch carries this DP rank's rows and the counts of the whole mini-batch (``LossScale``:
    the normalisers of every loss aggregation mode); metrics are averaged over the steps, with grad norm and lr
    named after ``prefix``.
    """
    steps, skipped = [], 0
    for mb in mini_batches:
        rows: Experience = mb.rows
        step = engine.train_step(
            model_inputs(rows, rows.present(), encoder),
            make_loss(rows, mb.scale),
            micro_batch_size,
            temperature,
            token_budget,
        )
        grad_key = "grad_norm" if prefix == "actor" else f"{prefix}/grad_norm"
        steps.append({**step.metrics, grad_key: step.grad_norm, f"{prefix}/lr": step.lr})
        skipped += int(step.skipped)
    # a skipped step (non-finite loss or gradient) is counted; the streak runs across iterations
    return {
        **average_metrics(steps),
        f"{prefix}/skipped_steps": float(skipped),
        f"{prefix}/nonfinite_streak": float(engine.nonfinite_streak),
    }


def average_metrics(steps: Iterable[Dict[str, float]]) -> Dict[str, float]:
    """Mean of each metric over the optimizer steps of one update call."""
    sums: Dict[str, float] = {}
    count = 0
    for metrics in steps:
        count += 1
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
    return {k: v / max(1, count) for k, v in sums.items()}
