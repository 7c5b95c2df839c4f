"""A rollout worker of the disaggregated layout: one rank of the inference world, on devices of its own.

Each engine's ranks (``infer_tensor_parallel_size`` of them) form a torch.distributed world of their own (no
megatron model, no training state), so that one engine can fail and restart while the others serve
(``workers/rollout_fleet.py``); ``engine_offset`` is the engine's index in the fleet. New weights arrive over the
engine's weight channel from the actor's sending rank (``rollout/weights/weight_transfer.py``): full megatron-named
tensors that each engine shards for itself, or (``weight_transfer: vllm_native``) HF-named tensors that vLLM's
weight-transfer engine in the worker receives and loads. ``health`` answers while a generation runs (the worker is
a threaded actor).

With in-flight weight updates (``in_flight``) the worker is a threaded actor: a generation runs in one thread
while the driver pauses the engine from another (``pause_generation``: once the step in progress ends), streams the
new weights in (``receive_weights``) and resumes it (``resume_generation``); the requests in flight go on and each
token records the version that sampled it (``rollout/engines/in_flight.py``).
"""

from __future__ import annotations

import os
import time
from typing import Dict, Optional, Tuple

import ray

from ..config_cls.generate_config import GenerateConfig
from ..config_cls.model_config import ModelConfig
from ..protocol import RankLayout, RolloutRequest, RolloutResult, WorldSpec
from .base_worker import start_worker_process
from .fault_injection import FaultPlan


class StaleWeights(RuntimeError):
    """A generation asked for a policy version the engine does not hold (a bug of the driver)."""


class PauseTimeout(RuntimeError):
    """An engine did not pause for an in-flight weight update within its deadline."""


def engine_agreement(engine_index: int, engine_size: int, world_size: int):
    """For an engine of several ranks: a function that gives every rank its first rank's "my gate is closed", so all
    hold at the same step (a gloo broadcast per step in a group per engine; every rank creates every group, in
    order). None for engines of one rank."""
    if engine_size == 1:
        return None
    import torch
    import torch.distributed as dist

    groups = [
        dist.new_group(list(range(e, e + engine_size)), backend="gloo") for e in range(0, world_size, engine_size)
    ]
    group, leader = groups[engine_index], engine_index * engine_size

    def agree(closed: bool) -> bool:
        flag = torch.tensor([int(closed)], dtype=torch.int32)
        dist.broadcast(flag, src=leader, group=group)
        return bool(flag.item())

    return agree


class RolloutWorker:
    # a health probe runs on a thread of its own while the calls of the default group (one at a time, on one
    # thread: the engine's thread-local state is built once) generate
    CONCURRENCY_GROUPS = {"probe": 1}

    def __init__(
        self,
        world: WorldSpec,
        model: ModelConfig,
        gen: GenerateConfig,
        eos_token_id: Optional[int],
        pad_token_id: int,
        bf16: bool,
        capture_routes: bool = False,
        processor_dir: Optional[str] = None,
        in_flight: bool = False,
        engine_offset: int = 0,
        incarnation: int = 0,
    ):
        from ..rollout.engines.factory import make_rollout_engine
        from ..rollout.engines.in_flight import PauseGate
        from ..utils import dist

        self.acc = start_worker_process(world)
        self.rank, self.world_size, self.gen = world.rank, world.world_size, gen
        # megatron's parallel state for the fallback engine (a full single-rank copy, used where vLLM cannot run
        # the model); vLLM builds its own groups over this world
        dist.init_model_parallel(1, 1, seed=gen.sampling_config.seed)
        self.engine = make_rollout_engine(
            model,
            gen,
            self.acc.kind,
            eos_token_id,
            pad_token_id,
            seed=gen.sampling_config.seed,
            bf16=bf16,
            capture_routes=capture_routes,
            processor_dir=processor_dir,
        )
        self.engine_size = self.engine.tensor_parallel_size
        local_engine, self.engine_rank = divmod(world.rank, self.engine_size)
        self.engine_index = engine_offset + local_engine
        self.faults = FaultPlan(self.engine_index, armed=incarnation == 0 and self.engine_rank == 0)
        self.version: Optional[int] = None
        self.channel = None
        # in-flight updates: an engine that steps (vLLM) lets them in between two steps, another between two calls
        self.gate = PauseGate() if in_flight else None
        self.gate_per_call = in_flight and not hasattr(self.engine, "step_in_flight")
        if in_flight and not self.gate_per_call:
            agree = engine_agreement(self.engine_index, self.engine_size, world.world_size)
            self.engine.step_in_flight(self.gate, lambda: self.version if self.version is not None else 0, agree)

    def layout(self) -> RankLayout:
        return RankLayout.of_engine_rank(self.rank, self.world_size, self.engine_size)

    # ----- weights ---------------------------------------------------------------------------------------
    def weight_transfer(self) -> Tuple[str, Optional[str]]:
        """How this worker's engine takes new weights: ``vllm_native`` (its vLLM was built with a
        weight-transfer engine) or ``channel``, with why not native where it was asked for."""
        backend = getattr(self.engine, "weight_transfer_backend", None)
        if backend is not None:
            return "vllm_native", None
        if self.gen.weight_transfer != "vllm_native":
            return "channel", None
        reason = getattr(self.engine, "weight_transfer_unavailable", None)
        return "channel", reason or f"the {self.engine.name} engine has no vLLM to receive through"

    def open_weight_channel(
        self, host: str, port: int, size: int, native_port: Optional[int] = None, timeout_s: float = 1800.0
    ) -> None:
        """Join the engine's weight channel as receiver ``rank + 1`` (rank 0 is the actor's sender); with
        ``native_port``, the tensors come through the engine's vLLM weight-transfer group on that port."""
        from ..rollout.weights.weight_transfer import VllmNativeChannel, WeightChannel

        comm = self.acc.comm_device(self.acc.current_device())
        if native_port is None:
            self.channel = WeightChannel(host, port, self.rank + 1, size, comm, timeout_s)
        else:
            backend = self.engine.weight_transfer_backend
            self.channel = VllmNativeChannel(
                host, port, self.rank + 1, size, comm, backend, native_port, self.engine, timeout_s
            )

    def receive_weights(self, version: int) -> Dict[str, float]:
        """Load the weights the actor streams now; the engine then holds policy ``version``."""
        t0 = time.perf_counter()
        self.engine.onload()
        fault = self.faults.begin("weights")
        if fault is None:
            stats = self.channel.load_into(self.engine)
        else:
            stats = self.faults.receive_then_strike(self.channel, self.engine, fault)
        self.version = version
        return {**stats, "timing/weight_sync": time.perf_counter() - t0}

    @ray.method(concurrency_group="probe")
    def health(self) -> Dict[str, int]:
        """A health probe's answer (it runs beside a generation): the engine, the version it holds, the process."""
        version = -1 if self.version is None else self.version
        return {"engine": self.engine_index, "version": version, "pid": os.getpid()}

    def pause_generation(self, timeout: float) -> float:
        """Close the engine's gate: returns (seconds waited) once its step in progress has ended; PauseTimeout naming
        the engine and the key when it does not within ``timeout`` s (the gate opens again)."""
        t0 = time.perf_counter()
        if not self.gate.pause(timeout):
            raise PauseTimeout(
                f"rollout engine {self.engine_index} (rank {self.rank}) did not pause for the weight update within "
                f"rl_config.async_training.pause_timeout_s = {timeout:g} s: its generation step did not end"
            )
        return time.perf_counter() - t0

    def resume_generation(self, recompute: bool = False) -> None:
        """Open the gate: the requests in flight go on with the weights just loaded (``recompute``: their KV
        cache recomputed under them first)."""
        self.gate.resume(recompute)

    # ----- rollout ---------------------------------------------------------------------------------------
    def generate(self, request: RolloutRequest, version: Optional[int] = None) -> RolloutResult:
        """The request's n responses per prompt (sample i seeded ``seed + i``) with the weights of ``version``,
        which this worker must already hold; only the engine's first rank returns the outputs."""
        if version is not None and version != self.version:
            raise StaleWeights(f"rollout rank {self.rank} holds policy version {self.version}, asked for {version}")
        request = request.with_sampling(self.gen.sampling_config)
        t0, started = time.perf_counter(), time.time()
        with self.faults.during(self.faults.begin("generate")) as fault:
            outputs = self._generate(request)
            if fault is not None and fault.action == "garbage":
                self.faults.garble(outputs)
        return RolloutResult(
            rank=self.rank,
            engine=self.engine_index,
            request_digest=request.digest(version),
            outputs=outputs if self.engine_rank == 0 else None,
            timing={"timing/generate": time.perf_counter() - t0},
            started=started,
        )

    def _generate(self, request: RolloutRequest):
        if self.gate_per_call:  # the whole call is one step: every token sampled by the version it began with
            with self.gate.generating():
                self.gate.hold_point()
                outputs = self.engine.generate(request) if request.prompts else []
                for out in outputs:
                    out.versions = [self.version or 0] * len(out.response_ids)
        else:
            outputs = self.engine.generate(request) if request.prompts else []
        return outputs

    def shutdown(self) -> None:
        from ..utils import dist

        self.engine.release_at_exit()  # the run's end: the process is killed next
        self.channel = None
        dist.destroy()
