#!/usr/bin/env bash
# On-policy distillation, Qwen2.5-32B teacher -> Qwen2.5-7B student (distill_qwen25_32b_to_7b_A3.yaml, 1 node x 16
# NPUs). Run the same command on every node:
#
#   NNODES=1 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/distill/distill_trainer_qwen25_32b_to_7b.sh [config name] [key=value ...]
#
# On one machine, the CPU twin (after `make demo`, whose trained actor is the teacher):
#   NNODES=1 bash examples/distill/distill_trainer_qwen25_32b_to_7b.sh distill_tiny_cpu
# What the launcher does: examples/launch_ray_job.sh.
DEFAULT_CONFIG=distill_qwen25_32b_to_7b_A3 exec bash "$(dirname "$0")/../launch_ray_job.sh" "$@"
