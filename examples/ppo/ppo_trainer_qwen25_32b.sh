#!/usr/bin/env bash
# PPO on Qwen2.5-32B in the MindSpeed-RL style (ppo_qwen25_32b_A3.yaml, 2 nodes x 16 NPUs). Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/ppo/ppo_trainer_qwen25_32b.sh [config name] [key=value ...]
#
# On one machine, the CPU twin:  NNODES=1 bash examples/ppo/ppo_trainer_qwen25_32b.sh ppo_tiny_cpu
# What the launcher does: examples/launch_ray_job.sh.
DEFAULT_CONFIG=ppo_qwen25_32b_A3 exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
