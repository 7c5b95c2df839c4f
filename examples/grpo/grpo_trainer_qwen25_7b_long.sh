#!/usr/bin/env bash
# GRPO on Qwen2.5-7B with responses up to 30K tokens (grpo_qwen25_7b_long_A3.yaml, 1 node x 16 NPUs: actor
# TP 1 x CP 4 x DP 4, docs/long_context.md). Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/grpo/grpo_trainer_qwen25_7b_long.sh [config name] [key=value ...]
#
# On one machine, the algorithm's CPU twin (short responses, no CP):
#   NNODES=1 bash examples/grpo/grpo_trainer_qwen25_7b_long.sh grpo_tiny_cpu
# What the launcher does: examples/launch_ray_job.sh.
DEFAULT_CONFIG=grpo_qwen25_7b_long_A3 exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
