"""Imported once by the forkserver that tests/parallel_worker.py's worlds and the in-process runs' rule-reward pools
fork from (tests/conftest.py), so that each process starts with torch, megatron-core, transformers, vLLM and the
verifiers already imported (4-6 s of CPU per process when each imports them itself). Only imports: every process
still applies the accelerator's patches and builds its own state."""

import importlib

import transformers  # noqa: F401

import mindspeed_rl.models.engine  # noqa: F401 - megatron-core as the device kind runs it (models/__init__.py)
import mindspeed_rl.rewards.pool_worker  # noqa: E402,F401
import mindspeed_rl.rewards.verifiers  # noqa: E402,F401
import tests.helpers  # noqa: E402,F401
import tests.parallel_worker  # noqa: E402,F401

for optional in ("vllm", "math_verify"):  # (a stack without vLLM runs the fallback engine)
    try:
        importlib.import_module(optional)
    except ImportError:
        pass
