"""Rollout engines behind one interface: vLLM (npu / cuda / cpu) and a megatron-core fallback."""
