"""megatron-core models and their engines. megatron-core is imported here first, as the device kind runs it: on CPU
its jit_fuser functions stay uncompiled in every process, whichever module imports it first (compiled by inductor in
a process that imported megatron-core before the CPU accelerator did, Qwen3-Next's gated-attention output came out
wrong under ATen's AVX2 kernels: logits off by 1.4 against transformers)."""

from ..accelerator import import_megatron_core

import_megatron_core()
