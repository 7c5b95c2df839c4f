"""Verifiers the rule-reward tests register (at import, as a user's plug-in module would: the runner imports
a verifier's module in each worker)."""

import os
import time

from mindspeed_rl.rewards.registry import register_verifier

FIRST_CALL = {"done": False}


@register_verifier("test_sleepy")
def sleepy(response, label):
    if response == "hang":
        time.sleep(30)
    if response == "boom":
        raise RuntimeError("bad verifier")
    if response == "inf":
        return float("inf")
    if response == "die":  # the worker process ends at once, as in a segfault
        os._exit(1)
    if response.startswith("slow"):  # "slow 0.4": that many seconds, under the timeout
        time.sleep(float(response.split()[1]))
    return 1.0


@register_verifier("test_lazy")
def lazy(response, label):
    """Slow on its first call in a process (math-verify importing sympy on a busy host): twice the test's
    per-sample timeout."""
    if not FIRST_CALL["done"]:
        time.sleep(2)
        FIRST_CALL["done"] = True
    return 1.0
