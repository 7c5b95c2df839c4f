"""How trained weights reach the engines: resharding, the weight channel, HF name conversion, INT8 quantization."""
