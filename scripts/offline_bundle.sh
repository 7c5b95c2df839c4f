#!/usr/bin/env bash
# Downloads, on a machine with a package registry, the wheels an air-gapped NVIDIA node needs for the device
# check (requirements/offline-cuda.txt), for that node's Python and platform, and prints what will travel.
#   bash scripts/offline_bundle.sh <python-version> <platform> <folder>
#   bash scripts/offline_bundle.sh 3.12 manylinux_2_28_x86_64 .offline_wheels
# Then carry the repository and <folder> to the node and run: bash scripts/device_check.sh <folder> <results>
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PINS="$ROOT/requirements/offline-cuda.txt"
LIMIT_MIB="${LIMIT_MIB:-64}"
die() { echo "[bundle] error: $*" >&2; exit 2; }

[ $# -eq 3 ] || die "usage: bash scripts/offline_bundle.sh <python-version> <platform> <folder> (e.g. 3.12 manylinux_2_28_x86_64 .offline_wheels)"
PYVER="$1" PLATFORM="$2" OUT="$3"
[[ "$PYVER" =~ ^3\.[0-9]+$ ]] || die "python-version: '$PYVER' is not like 3.12"
[[ "$PLATFORM" =~ ^(manylinux_2_([0-9]+)|manylinux2014|linux)_(x86_64|aarch64)$ ]] \
    || die "platform: '$PLATFORM' is not like manylinux_2_28_x86_64"
if [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"; else PY="${PYTHON:-python3}"; fi
"$PY" -m pip --version >/dev/null 2>&1 || die "$PY has no pip"

# pip matches platform tags exactly: a manylinux_2_N node also takes wheels for every older glibc
ARCH="${BASH_REMATCH[3]}"
PLATFORMS=(--platform "$PLATFORM")
if [ -n "${BASH_REMATCH[2]:-}" ]; then
    for ((n = BASH_REMATCH[2] - 1; n >= 17; n--)); do PLATFORMS+=(--platform "manylinux_2_${n}_${ARCH}"); done
    PLATFORMS+=(--platform "manylinux2014_${ARCH}")
fi

mkdir -p "$OUT"
rm -f "$OUT"/*.whl
mapfile -t WHEELS < <(grep -vE '^\s*(#|$)' "$PINS" | grep -v '# sdist' | sed -E 's/\s*#.*$//')
mapfile -t SDISTS < <(grep -vE '^\s*(#|$)' "$PINS" | grep '# sdist' | sed -E 's/\s*#.*$//')
echo "[bundle] Python $PYVER, $PLATFORM: ${WHEELS[*]} ${SDISTS[*]}"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    "${PLATFORMS[@]}" -d "$OUT" "${WHEELS[@]}" 2> >(grep -v "is neither a file nor a directory" >&2) || die "pip download failed (is a package registry reachable?)"
if [ ${#SDISTS[@]} -gt 0 ]; then  # pure-Python sources without wheels: built into wheels here
    "$PY" -m pip wheel -q --no-deps -w "$OUT" "${SDISTS[@]}" || die "pip wheel failed for ${SDISTS[*]}"
fi
(cd "$OUT" && ls -1 *.whl) > "$OUT/VERSIONS.txt"

wheels_bytes=$(du -cb "$OUT"/*.whl | tail -n1 | cut -f1)
repo_bytes=$(cd "$ROOT" && git ls-files -z | xargs -0 du -cb 2>/dev/null | awk '/total$/ {s += $1} END {print s + 0}')
total=$((wheels_bytes + repo_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "[bundle] wheels:"
sed 's/^/[bundle]   /' "$OUT/VERSIONS.txt"
echo "[bundle] wheels $(mib "$wheels_bytes") + repository (tracked files) $(mib "$repo_bytes") = $(mib "$total") of ${LIMIT_MIB} MiB"
[ "$total" -le $((LIMIT_MIB * 1048576)) ] || die "the bundle is over ${LIMIT_MIB} MiB"
