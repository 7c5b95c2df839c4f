"""Weights: hf <-> mcore name maps, TP/PP split and merge, the Megatron checkpoint layout."""
