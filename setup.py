"""mindspeed_rl: PPO post-training for LLMs with Megatron-core, vLLM and Ray (NPU / GPU / CPU)."""

from setuptools import find_packages, setup

setup(
    name="mindspeed_rl",
    version="0.1.0",
    description="PPO post-training for large language models: Megatron-core training, "
    "vLLM rollout, Ray orchestration, on Ascend NPU, NVIDIA GPU and CPU",
    packages=find_packages(include=["mindspeed_rl", "mindspeed_rl.*"]),
    python_requires=">=3.10,<3.13",
    # Pins live in requirements/<device>.txt and are installed by scripts/install.sh,
    # because the order (torch first, vLLM without its torch deps) matters.
    install_requires=[],
)
