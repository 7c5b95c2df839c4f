"""Vision towers and the vision-language wrapper around the megatron-core language model (Qwen2.5-VL).

The tower is plain torch, replicated on every rank of a tensor-parallel group (its weights are a few percent
of the language model's; each rank encodes the images of its own micro-batch); the language model is the
family's megatron-core GPTModel with multimodal rotary positions (mrope), so TP / PP / DP apply to it unchanged.
"""
