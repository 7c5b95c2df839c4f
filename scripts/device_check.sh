#!/usr/bin/env bash
# The device check on a bare (air-gapped) node: installs the carried wheels into a private folder (the image's
# own packages are never touched), then runs bench/device_check.py, which writes device_check.json and
# device_check.md into <results> after every step.
#   bash scripts/device_check.sh <wheel folder> <results folder> [bench/device_check.py options]
#   bash scripts/device_check.sh .offline_wheels results --minutes 7
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "[device_check] error: $*" >&2; exit 2; }
[ $# -ge 2 ] || die "usage: bash scripts/device_check.sh <wheel folder> <results folder> [options]"
WHEELS="$1" RESULTS="$2"
shift 2
PY="${PYTHON:-python3}"
compgen -G "$WHEELS/*.whl" >/dev/null || die "$WHEELS holds no wheels: make them with scripts/offline_bundle.sh"
mkdir -p "$RESULTS"
SITE="${SITE:-$(mktemp -d "${TMPDIR:-/tmp}/mindspeed_rl_site.XXXXXX")}"
start=$(date +%s)
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl \
    || die "installing $WHEELS into $SITE failed"
echo "[device_check] installed $(ls "$WHEELS"/*.whl | wc -l) wheels into $SITE in $(( $(date +%s) - start )) s"
export PYTHONPATH="$ROOT:$SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
cd "$ROOT"
set +e
# in seconds: the vendor image's timeout(1) refused "9m30s"
timeout 570 "$PY" bench/device_check.py --out "$RESULTS" "$@" 2>&1 | tee "$RESULTS/device_check.log"
rc=${PIPESTATUS[0]}
set -e
[ "$rc" -eq 124 ] && echo "[device_check] stopped at 570 s; the steps that ended are in $RESULTS"
exit "$rc"
