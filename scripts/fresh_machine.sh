#!/usr/bin/env bash
# What a new machine does with this repository: clone HEAD (committed work only) into a
# temporary folder, make a bare venv (python -m venv, no system packages), and run .ci/run there
# under another CPU's kernels (ATEN_CPU_CAPABILITY=default: torch's portable code path, which
# rounds differently from the AVX2/AVX-512 kernels a developer's machine picks).
#
#     bash scripts/fresh_machine.sh            # exit status: .ci/run's
#     KEEP=1 bash scripts/fresh_machine.sh     # keep the folder to look inside afterwards
#
# Run it before calling work done: a green CI on a machine that already holds a package hides a
# missing install step, and digits compared exactly hide a test that fails on another CPU.
set -euo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
python=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rl-crosscheck-fresh.XXXXXX")
if [ "${KEEP:-0}" = 1 ]; then echo "kept: $tmp"; else trap 'rm -rf "$tmp"' EXIT; fi
git clone -q "$repo" "$tmp/rl-crosscheck"
echo "fresh clone of $(git -C "$tmp/rl-crosscheck" log -1 --format='%h %s' | cut -c1-80)"
"$python" -m venv "$tmp/venv"
export PATH="$tmp/venv/bin:$PATH" VIRTUAL_ENV="$tmp/venv" ATEN_CPU_CAPABILITY=default CI=true
unset PYTHONPATH
cd "$tmp/rl-crosscheck"
echo "bare venv: $(python -c 'import sys; print(sys.prefix)'), $(python -m pip list 2>/dev/null | tail -n +3 | wc -l) packages"
start=$(date +%s)
status=0
bash .ci/run || status=$?
echo "fresh-machine check: .ci/run exited $status in $(( $(date +%s) - start )) s" \
     "(ATEN_CPU_CAPABILITY=default, $(python -c 'import torch; print("torch", torch.__version__)'))"
exit $status
