#!/usr/bin/env bash
# The Ray launcher every recipe script calls (examples/{ppo,grpo,dapo}/*.sh): run the same command on
# every node:
#
#   NNODES=2 NPUS_PER_NODE=16 MASTER_ADDR=10.0.0.1 SOCKET_IFNAME=enp189s0f0 CURRENT_IP=<this node's IP> \
#       bash examples/<recipe script> [config name] [key=value ...]
#
# The head (CURRENT_IP == MASTER_ADDR, or NODE_RANK=0) starts Ray with the device resource, waits
# until NNODES x NPUS_PER_NODE devices have joined, runs $ENTRY (cli/train_ppo.py: one trainer for PPO, GRPO,
# DAPO: the config's rl_config decides) and tees logs/training.log. Other nodes join once the head answers and
# wait until the head's cluster goes away. Each node stops only the Ray it started (the session it started Ray in,
# recorded in $RAY_TMP.launcher_sid.<pid>), never other processes. Logs go to $LOG_DIR (default logs/).
set -euo pipefail
CALLER_DIR=$PWD
cd "$(dirname "$0")/.."
if [ "$CALLER_DIR" != "$PWD" ]; then
  echo "[launcher] running in $PWD: relative paths in the config and the overrides are read from there"
fi
PY=${PYTHON:-.venv/bin/python}
ENTRY=${ENTRY:-cli/train_ppo.py}  # the trainer: cli/train_rm.py for reward-model training (examples/rm)
RAY=${RAY:-$(dirname "$PY")/ray}

CONFIG=${1:-${DEFAULT_CONFIG:?the recipe script sets DEFAULT_CONFIG}}
shift || true
DEFAULT_IP=$(hostname -I 2>/dev/null | awk '{print $1}')
DEFAULT_IP=${DEFAULT_IP:-127.0.0.1}
NNODES=${NNODES:-1}
MASTER_ADDR=${MASTER_ADDR:-$DEFAULT_IP}
CURRENT_IP=${CURRENT_IP:-$DEFAULT_IP}
RAY_PORT=${RAY_PORT:-6344}
WAIT_SECONDS=${WAIT_SECONDS:-600}
DEVICE_RESOURCE=$("$PY" -c "from mindspeed_rl.accelerator import get_accelerator as g; print(g().ray_resource)")
if [ "$DEVICE_RESOURCE" = "CPU" ]; then
  NPUS_PER_NODE=${NPUS_PER_NODE:-$(nproc)}
else
  NPUS_PER_NODE=${NPUS_PER_NODE:-16}
fi
if [ -n "${SOCKET_IFNAME:-}" ]; then
  export GLOO_SOCKET_IFNAME=$SOCKET_IFNAME TP_SOCKET_IFNAME=$SOCKET_IFNAME HCCL_SOCKET_IFNAME=$SOCKET_IFNAME
fi
# Ray >= 2.5x enables token authentication; share RAY_AUTH_TOKEN across nodes to keep it on.
if [ -z "${RAY_AUTH_TOKEN:-}" ]; then export RAY_AUTH_MODE=${RAY_AUTH_MODE:-disabled}; fi
export NPUS_PER_NODE
RAY_TMP=${RAY_TMP:-/tmp/ray_mindspeed_rl_${RAY_PORT}_$(id -u)}
NODE_RANK=${NODE_RANK:-$([ "$CURRENT_IP" = "$MASTER_ADDR" ] && echo 0 || echo 1)}

case "$DEVICE_RESOURCE" in
  NPU) RESOURCES=(--resources "{\"NPU\": $NPUS_PER_NODE}") ;;
  GPU) RESOURCES=(--num-gpus "$NPUS_PER_NODE") ;;
  *)   RESOURCES=(--num-cpus "$NPUS_PER_NODE") ;;
esac

SID_FILE="$RAY_TMP.launcher_sid.$$"  # this launcher's own (several may share RAY_TMP on one host)
STOP_CLEANLY=1  # 0: stop_own_ray sends SIGKILL at once
stop_own_ray() {
  # Ray is started in a session of its own (setsid); every Ray process of this node (gcs, raylet, agents,
  # workers) carries that session id, recorded in $SID_FILE: stop exactly that session, nothing matched by
  # name or command line. In the order `ray stop` uses, SIGTERM to the raylet, then the others, the GCS last
  # (stopped all at once they wait on each other for 10 s and more), each given a few seconds (the GCS, which
  # keeps nothing once the others are gone, 2 s); SIGKILL for what is left
  [ -f "$SID_FILE" ] || return 0
  local sid
  sid=$(cat "$SID_FILE")
  rm -f "$SID_FILE"
  [[ "$sid" =~ ^[0-9]+$ ]] || return 0
  local step name pids deadline
  for step in raylet:4 others:4 gcs_server:2; do
    [ "$STOP_CLEANLY" = 1 ] || break
    name=${step%:*}
    deadline=$((SECONDS + ${step#*:}))
    pids=$(ps -o pid=,stat=,comm= -s "$sid" 2>/dev/null | awk -v name="$name" '$2 !~ /^Z/ &&
      (name == "others" ? $3 != "raylet" && $3 != "gcs_server" : $3 == name) {print $1}') || true
    [ -n "$pids" ] || continue
    kill $pids 2>/dev/null || true
    # until those processes are gone (a zombie is gone: its parent, not us, would have to reap it)
    while ps -o stat= -p "${pids//$'\n'/,}" 2>/dev/null | grep -qv '^Z' && [ "$SECONDS" -lt "$deadline" ]; do
      sleep 0.1
    done
  done
  pkill -9 -s "$sid" 2>/dev/null || true
}
start_own_ray() {  # start_own_ray LOG ARGS...: `ray start ARGS` as the leader of a new session
  local log=$1
  shift
  mkdir -p "$(dirname "$RAY_TMP")"
  setsid bash -c 'echo $$ > "$0"; exec "$@"' "$SID_FILE" "$RAY" start "$@" > "$log" 2>&1
}
trap stop_own_ray EXIT

cluster_devices() {
  timeout 60 "$PY" - "$MASTER_ADDR:$RAY_PORT" "$DEVICE_RESOURCE" <<'PYEOF'
import sys, ray
ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
print(int(ray.cluster_resources().get(sys.argv[2], 0)))
PYEOF
}

ray_failed() {  # ray_failed LOG: the reason `ray start` gave, on the console
  local reason
  reason=$(grep -iE "error|exception|refused|in use|denied|failed" "$1" 2>/dev/null | grep -v "^ *File " | tail -n 3) || true
  echo "[launcher] error: ray start failed (${reason:-see $1}); the whole output is in $1" >&2
}

head_answers() {  # the head's GCS port accepts a TCP connection within 5 s
  timeout 5 bash -c "echo > /dev/tcp/$MASTER_ADDR/$RAY_PORT" 2>/dev/null
}

own_raylet_alive() {  # the raylet of the session this launcher started Ray in still runs
  [ -f "$SID_FILE" ] && ps -s "$(cat "$SID_FILE")" -o comm= 2>/dev/null | grep -qx raylet
}

head_registers_late() {  # head_registers_late LOG: `ray start` gave up on a raylet that registers later
  # Ray waits a fixed 30 s for its raylet to register with the GCS; on a loaded host that can pass while both
  # keep starting. Then the node is taken if its devices reach the cluster within another 60 s.
  grep -q "timed out during startup" "$1" 2>/dev/null || return 1
  echo "[launcher] ray start: the head's raylet did not register within Ray's 30 s; waiting 60 s more for it"
  local until=$((SECONDS + 60))
  while [ "$SECONDS" -lt "$until" ]; do
    own_raylet_alive || return 1
    [ "$(cluster_devices 2>/dev/null || echo 0)" -ge "$NPUS_PER_NODE" ] && return 0
    sleep 2
  done
  return 1
}

start_head() {  # start_head LOG: the head's `ray start`, again while its raylet dies starting, until WAIT_SECONDS
  # On a loaded host the raylet can also die while it starts: it waits about 20 s for its metrics agent (a Python
  # process) to write its port, then aborts. Waiting is no use then; a stopped and restarted head is.
  local log=$1 deadline=$((SECONDS + WAIT_SECONDS))
  while true; do
    start_own_ray "$log" --head --port "$RAY_PORT" --node-ip-address "$CURRENT_IP" \
      --temp-dir "$RAY_TMP" --include-dashboard false --disable-usage-stats "${RESOURCES[@]}" && return 0
    head_registers_late "$log" && return 0
    grep -q "timed out during startup" "$log" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ] || return 1
    echo "[launcher] ray start: the head's raylet never registered; starting the head again"
    cp "$log" "$log.failed"
    stop_own_ray
    sleep 2
  done
}

LOG_DIR=${LOG_DIR:-logs}
mkdir -p "$LOG_DIR"
if [ "$NODE_RANK" = "0" ]; then
  # the config first, in seconds: a typo must not wait for Ray and the other nodes
  "$PY" "$ENTRY" --config-name "$CONFIG" --check "$@" > "$LOG_DIR/plan.txt" || exit $?
  echo "[launcher] head $CURRENT_IP: ray start --head --port $RAY_PORT (${NPUS_PER_NODE} x $DEVICE_RESOURCE)"
  if ! start_head "$LOG_DIR/ray_head.log"; then
    ray_failed "$LOG_DIR/ray_head.log"
    exit 2
  fi
  want=$((NNODES * NPUS_PER_NODE))
  deadline=$((SECONDS + WAIT_SECONDS))
  while true; do
    have=$(cluster_devices 2>/dev/null || echo 0)
    echo "[launcher] $have / $want $DEVICE_RESOURCE in the cluster"
    [ "$have" -ge "$want" ] && break
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "[launcher] error: only $have of $want devices joined within ${WAIT_SECONDS}s" >&2
      exit 2
    fi
    sleep 2
  done
  RAY_ADDRESS="$MASTER_ADDR:$RAY_PORT" "$PY" "$ENTRY" --config-name "$CONFIG" "$@" 2>&1 \
      | tee "$LOG_DIR/training.log"
  exit "${PIPESTATUS[0]}"
else
  echo "[launcher] node $CURRENT_IP joins $MASTER_ADDR:$RAY_PORT"
  deadline=$((SECONDS + WAIT_SECONDS))
  # the head's GCS first: a `ray start --address` begun before it listens gives up after its own timeout (about a
  # minute, seen here), even when the head comes up meanwhile
  until head_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "[launcher] error: the head $MASTER_ADDR:$RAY_PORT did not answer within ${WAIT_SECONDS}s" >&2
      exit 2
    fi
    sleep 1
  done
  until start_own_ray "$LOG_DIR/ray_node.log" --address "$MASTER_ADDR:$RAY_PORT" --node-ip-address "$CURRENT_IP" \
        --temp-dir "$RAY_TMP" --disable-usage-stats "${RESOURCES[@]}"; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      ray_failed "$LOG_DIR/ray_node.log"
      echo "[launcher] error: could not join $MASTER_ADDR:$RAY_PORT within ${WAIT_SECONDS}s" >&2
      exit 2
    fi
    stop_own_ray  # what a failed attempt left running (a raylet that missed Ray's wait): one raylet per node
    sleep 2
  done
  # wait while the head's GCS port answers
  while head_answers; do sleep 1; done
  echo "[launcher] the head's cluster is gone; stopping"
  STOP_CLEANLY=0  # nothing to stop cleanly for: without their GCS this node's processes would wait 10 s and more
fi
