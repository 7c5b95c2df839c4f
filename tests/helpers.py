"""Small builders shared by tests."""
from mindspeed_rl.config_cls import ModelConfig


def tiny_model_config(**overrides) -> ModelConfig:
    values = dict(num_layers=2, hidden_size=64, ffn_hidden_size=160, num_attention_heads=4,
                  max_position_embeddings=256, padded_vocab_size=256, group_query_attention=True,
                  num_query_groups=2, add_qkv_bias=True, untie_embeddings_and_output_weights=True,
                  rotary_base=10000.0, norm_epsilon=1e-6)
    values.update(overrides)
    cfg = ModelConfig(**values)
    cfg.validate()
    return cfg
