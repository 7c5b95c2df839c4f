"""Differences between the library releases we pin, each in one place.

``megatron_core`` and ``vllm`` hold one function per API difference between the releases the
CPU / CUDA stacks pin (megatron-core 0.16, vLLM 0.32) and those the NPU stack pins (megatron-core
0.12, vLLM 0.18), with the release that introduced the difference named in its docstring. The rest
of the code calls these functions and never compares versions itself. Each difference is detected
by the feature itself (a keyword, an attribute), not by version numbers, so a release in between
takes whichever path it supports.
"""
