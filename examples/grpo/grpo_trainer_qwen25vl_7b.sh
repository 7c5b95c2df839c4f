#!/usr/bin/env bash
# Vision-language GRPO on Qwen2.5-VL-7B-Instruct (grpo_qwen25vl_7b_A3.yaml, 1 node x 16 NPUs). Preprocess the
# images first (python cli/preprocess_data.py --config-name geometry3k), then run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/grpo/grpo_trainer_qwen25vl_7b.sh [config name] [key=value ...]
#
# Qwen2.5-VL-32B on 2 nodes: NNODES=2 ... bash examples/grpo/grpo_trainer_qwen25vl_7b.sh grpo_qwen25vl_32b_A3
# On one machine, the CPU twin (python cli/prepare_demo.py --vision first):
#   NNODES=1 bash examples/grpo/grpo_trainer_qwen25vl_7b.sh grpo_tiny_cpu_vision
# What the launcher does: examples/launch_ray_job.sh.
DEFAULT_CONFIG=grpo_qwen25vl_7b_A3 exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
