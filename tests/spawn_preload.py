"""Imported once by the forkserver that tests/parallel_worker.py's worlds fork from, so that each rank starts with
torch, megatron-core, transformers and vLLM already imported (4-6 s of CPU per process when each imports them
itself). Only imports: every rank still applies the accelerator's patches and builds its own state."""

import importlib

from mindspeed_rl.accelerator import detect_device_kind

if detect_device_kind() == "cpu":  # megatron-core as the CPU accelerator imports it (no compiled fusers)
    from mindspeed_rl.accelerator.megatron_cpu_compat import import_without_compiled_fusers

    import_without_compiled_fusers()

import transformers  # noqa: E402,F401

import mindspeed_rl.models.engine  # noqa: E402,F401
import tests.helpers  # noqa: E402,F401
import tests.parallel_worker  # noqa: E402,F401

try:
    importlib.import_module("vllm")
except ImportError:  # a stack without vLLM: its ranks use the fallback engine
    pass
