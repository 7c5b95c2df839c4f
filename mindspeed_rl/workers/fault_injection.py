"""Faults a rollout worker injects into itself on purpose, to test fault tolerance end to end (docs/operations.md):

    MINDSPEED_RL_INJECT_FAULTS="kill@generate:1:2,stop@generate:0:3,kill@weights:1:2,garbage@generate:0:1"

``ACTION@PHASE:ENGINE:CALL``: at the CALL-th call (1-based) of PHASE on rollout engine ENGINE, its first rank
- ``kill``: sends itself SIGKILL (the process dies),
- ``stop``: sends itself SIGSTOP (the process hangs until it is killed),
- ``garbage``: answers token ids no vocabulary has (generate only).
PHASE ``generate`` strikes 0.2 s into the call (mid-generation), or as the call ends when it is shorter;
``weights`` strikes after the first piece of the stream arrived (mid-sync). Only an engine's first incarnation is
armed: its restart runs clean. Unset: nothing is injected."""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional

ENV = "MINDSPEED_RL_INJECT_FAULTS"
ACTIONS = {"kill": signal.SIGKILL, "stop": signal.SIGSTOP, "garbage": None}
PHASES = ("generate", "weights")
GARBAGE_TOKEN = 2**31 - 1  # no vocabulary has it
STRIKE_AFTER_S = 0.2


@dataclass(frozen=True)
class Fault:
    action: str
    phase: str
    engine: int
    call: int


def parse_faults(text: str) -> List[Fault]:
    """The faults of ``text`` (the variable's value); ValueError naming the variable and the item."""
    faults = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        try:
            action, rest = item.split("@")
            phase, engine, call = rest.split(":")
            fault = Fault(action, phase, int(engine), int(call))
        except ValueError:
            fault = None
        if fault is None or fault.action not in ACTIONS or fault.phase not in PHASES or fault.call < 1:
            raise ValueError(
                f"{ENV}: {item!r} is not ACTION@PHASE:ENGINE:CALL (actions {sorted(ACTIONS)}, phases {list(PHASES)})"
            )
        if fault.action == "garbage" and fault.phase != "generate":
            raise ValueError(f"{ENV}: {item!r}: garbage is an answer, of the generate phase")
        faults.append(fault)
    return faults


def strike(action: str) -> None:
    os.kill(os.getpid(), ACTIONS[action])


class FaultPlan:
    """The faults planned for one engine's first rank, counted call by call."""

    def __init__(self, engine: int, armed: bool):
        planned = parse_faults(os.environ.get(ENV, "")) if armed else []
        self.faults: Dict[tuple, Fault] = {(f.phase, f.call): f for f in planned if f.engine == engine}
        self.calls: Counter = Counter()

    def begin(self, phase: str) -> Optional[Fault]:
        """A call of ``phase`` begins: the fault planned for it, if any."""
        self.calls[phase] += 1
        return self.faults.get((phase, self.calls[phase]))

    @contextmanager
    def during(self, fault: Optional[Fault]) -> Iterator[Optional[Fault]]:
        """Around a generate call: a kill or stop strikes STRIKE_AFTER_S into it, or as it ends."""
        if fault is None or ACTIONS[fault.action] is None:
            yield fault
            return
        timer = threading.Timer(STRIKE_AFTER_S, strike, (fault.action,))
        timer.start()
        yield fault
        timer.join()

    @staticmethod
    def garble(outputs) -> None:
        for out in outputs:
            out.response_ids = [GARBAGE_TOKEN] * len(out.response_ids)

    @staticmethod
    def receive_then_strike(channel, engine, fault: Fault) -> Dict[str, float]:
        """A weight sync that strikes after its first piece (through vLLM's own transfer: STRIKE_AFTER_S in)."""
        from ..rollout.weights.weight_transfer import VllmNativeChannel

        if isinstance(channel, VllmNativeChannel):
            timer = threading.Timer(STRIKE_AFTER_S, strike, (fault.action,))
            timer.start()
            stats = channel.load_into(engine)
            timer.join()
            return stats

        def pieces():
            for count, piece in enumerate(channel.receive()):
                yield piece
                if count == 0:
                    strike(fault.action)

        return engine.update_weights(pieces())
