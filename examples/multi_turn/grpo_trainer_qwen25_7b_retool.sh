#!/usr/bin/env bash
# ReTool-style multi-turn GRPO with the Python tool on Qwen2.5-7B (grpo_qwen25_7b_retool.yaml, 1 node x 16 NPUs).
# Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/multi_turn/grpo_trainer_qwen25_7b_retool.sh [config name] [key=value ...]
#
# The plan without starting anything:   ... grpo_trainer_qwen25_7b_retool.sh grpo_qwen25_7b_retool dry_run=true
# On one machine, the CPU twin:          NNODES=1 bash examples/multi_turn/grpo_trainer_qwen25_7b_retool.sh grpo_tiny_cpu_tools
DEFAULT_CONFIG=grpo_qwen25_7b_retool exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
