"""mindspeed_rl: PPO post-training for large language models."""

import warnings

# megatron-core warns at every import when Transformer Engine / Apex are absent (always on CPU and
# NPU); the device layer logs once which implementations are used instead.
warnings.filterwarnings("ignore", message=r".*(Transformer Engine|Apex).*not installed.*")

__version__ = "0.1.0"
