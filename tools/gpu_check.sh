#!/usr/bin/env bash
# The project's GPU check, for a bare GPU machine with the repository copied over: every test file that has a
# CUDA test, then `python -m sat_core.bench decode` and `train` at COCO size (14×14×2048 annotations, LSTM,
# embedding and attention 512, vocabulary 10,000; fp32 and bf16), in under 8 minutes (each part has its own time
# limit). The benchmarks' --json output, with the device, the date, the versions and the tests' outcome, goes into
# docs/benchmarks/<device>-<date>.json (and a copy into $OUT where that is set).
#
#   tools/gpu_check.sh                       # on the GPU machine, from any folder
#   DEVICE=cpu QUICK=1 TESTS=tests/test_beam_graph.py tools/gpu_check.sh   # the script itself on a CPU
#
# Python packages the machine lacks travel as wheels in .whl/ at the repository's root, fetched beforehand with
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#       -d .whl pycocoevalcap==1.2 plotly==7.1.0
# and installed here into a folder of their own. Tests that need streamlit skip where it is absent.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 2
DEVICE="${DEVICE:-cuda}"
QUICK="${QUICK:-}"
TMP="$(mktemp -d)"
export PYTHONUNBUFFERED=1
started=$(date +%s)

if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sat-site \
        .whl/*.whl || exit 2
    export PYTHONPATH="/tmp/sat-site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ "$DEVICE" = cuda ] && ! python3 -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "error: no CUDA GPU is visible to PyTorch here; DEVICE=cpu runs the script on a CPU" >&2
    exit 2
fi
name=$(python3 -c "import torch; print(torch.cuda.get_device_name(0) if '$DEVICE' == 'cuda' else 'cpu')")
slug=$(echo "$name" | tr '[:upper:]' '[:lower:]' | sed -E 's/[^a-z0-9]+/-/g; s/^-|-$//g')
today=$(date -u +%F)
echo "== $name ($slug), $today"

# Every test file with a CUDA test, whole (their CPU tests too), spread over the machine's cores.
if [ -n "${TESTS:-}" ]; then  # other test files, e.g. to try the script
    read -r -a files <<<"$TESTS"
else
    mapfile -t files < <(grep -lE "torch\.cuda|\"cuda\"|'cuda'" tests/test_*.py | sort)
fi
workers=()
if python3 -c "import xdist" 2>/dev/null; then
    workers=(-n "$(( $(nproc) < 16 ? $(nproc) : 16 ))")
fi
per_test=()
if python3 -c "import pytest_timeout" 2>/dev/null; then
    per_test=(--timeout 200)
fi
echo "== tests: ${files[*]}"
timeout 180 python3 -m pytest "${files[@]}" -p no:cacheprovider "${workers[@]}" "${per_test[@]}" \
    2>&1 | tee "$TMP/tests.log"
tests_rc=$?

# The benchmarks at COCO size; --quick: tiny sizes, to try the script.
bench() {  # bench WHAT SECONDS
    local what=$1 limit=$2 flags=(--device "$DEVICE" --precision all --json "$TMP/$1.json")
    [ "$what" = decode ] && flags+=(--model coco)
    [ -n "$QUICK" ] && flags+=(--quick)
    echo "== bench $what ${flags[*]}"
    timeout "$limit" python3 -m sat_core.bench "$what" "${flags[@]}"
}
bench decode 140; decode_rc=$?
bench train 150; train_rc=$?

out="docs/benchmarks/$slug-$today.json"
n=2
while [ -e "$out" ]; do out="docs/benchmarks/$slug-$today-$n.json"; n=$((n + 1)); done
mkdir -p docs/benchmarks
python3 - "$TMP" "$out" "$name" "$today" "$tests_rc" "$decode_rc" "$train_rc" "$(( $(date +%s) - started ))" \
    "${files[@]}" <<'EOF'
import json, pathlib, subprocess, sys

import torch

tmp, out, name, today, tests_rc, decode_rc, train_rc, seconds, *files = sys.argv[1:]
tmp = pathlib.Path(tmp)
read = lambda what: json.loads((tmp / f"{what}.json").read_text()) if (tmp / f"{what}.json").is_file() else None
log = (tmp / "tests.log").read_text().strip().splitlines()
commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip() or None
record = {
    "device": name, "date": today, "commit": commit, "torch": torch.__version__, "cuda": torch.version.cuda,
    "seconds": int(seconds),
    "tests": {"files": files, "exit_code": int(tests_rc), "summary": log[-1] if log else ""},
    "decode": (read("decode") or {}).get("decode"), "one_by_one": (read("decode") or {}).get("one_by_one"),
    "decode_exit_code": int(decode_rc),
    "train": (read("train") or {}).get("train"), "train_exit_code": int(train_rc),
}
pathlib.Path(out).write_text(json.dumps(record, indent=1) + "\n")
print(f"wrote {out}")
EOF
[ -n "${OUT:-}" ] && cp "$out" "$OUT/"
echo "== $(( $(date +%s) - started )) s; tests exit $tests_rc, bench decode exit $decode_rc, bench train exit $train_rc"
rm -rf "$TMP"
[ "$tests_rc" = 0 ] && [ "$decode_rc" = 0 ] && [ "$train_rc" = 0 ]
