"""The rollout engines: vLLM and the megatron-core fallback behind one interface, the factory that chooses, sampling,
prompts with images."""
