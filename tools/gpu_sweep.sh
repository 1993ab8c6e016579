#!/usr/bin/env bash
# Soft-model candidates trained side by side on one GPU machine and judged on the validation suite: the scenes
# world (A), a copy with 30 % of its training pictures zoomed out (B), and with half of them mirrored too (C; D is
# C at twice the epochs), each the soft preset at batch 256 (the rate scaled from batch 64 by the square-root rule).
# A recipe experiment (docs/EXPERIMENTS.md, 2026-11-28). On a bare GPU machine with the repository copied over,
# the EfficientNet-Lite0 weights package and pycocoevalcap's bleu/cider/rouge in .dev/site:
#   MAXMIN=4.5 RUNS="A B C" tools/gpu_sweep.sh        # OUT: where the validation figures go
# DEVICE=cpu N_TRAIN=200 N_VAL=20 EPOCHS=1 BATCH=32 WORKERS=2 tries the script on a CPU.
set -u -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/.dev/site:$PWD" OMP_NUM_THREADS=${THREADS:-3}
N_TRAIN=${N_TRAIN:-24000}; N_VAL=${N_VAL:-400}; EPOCHS=${EPOCHS:-5}; MAXMIN=${MAXMIN:-4.5}
DEVICE=${DEVICE:-cuda}; BATCH=${BATCH:-256}; WORKERS=${WORKERS:-16}; RUNS=${RUNS:-"A B C D"}
OUT=${OUT:-/tmp/sweep_out}; W=${WORK:-/tmp/sweep}; L="$W/logs"; mkdir -p "$OUT" "$W/runs" "$L"
pack() { tar czf "$OUT/logs.tgz" -C "$W" logs; }
t0=$(date +%s); stamp() { echo "== $(( $(date +%s) - t0 )) s: $*"; }
python3 -c "import torch; print(torch.__version__, torch.cuda.is_available() and torch.cuda.get_device_name(0))"
nproc; stamp start
smi=""; if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv -l 20 > "$L/smi.log" 2>&1 & smi=$!; fi

python3 -m sat_core.world --kind scenes --out "$W/A" --train "$N_TRAIN" --val "$N_VAL" --test 0 --seed 0 \
    --caption-order largest_first --workers "$WORKERS" || exit 3
stamp world
python3 -m sat_core.world --kind scenes --shifted-validation --out "$W/vs/shifted_validation" --train 0 \
    --val "$N_VAL" --test 0 --workers 4 > "$L/shv.log" 2>&1 & prep="$!"
python3 -m sat_core.transforms --data "$W/A/dataset.json" --out "$W/vs" --split val > "$L/suite.log" 2>&1 & prep="$prep $!"
python3 tools/geometric_world.py --data "$W/A/dataset.json" --out "$W/B" --zoom 0.3 --workers 6 & prep="$prep $!"
python3 tools/geometric_world.py --data "$W/A/dataset.json" --out "$W/C" --zoom 0.3 --flip 0.5 --workers 6 & prep="$prep $!"
wait $prep
ln -sfn "$W/C" "$W/D"
stamp derived worlds

train() {  # train NAME EPOCHS
    python3 -m sat_core.train --config sat_core/presets/scenes_soft.json --data "$W/$1/dataset.json" \
        --images "$W/$1" --out "$W/runs/$1" --epochs "$2" --max-minutes "$MAXMIN" --batch-size "$BATCH" \
        --lr-batch 64 --device "$DEVICE" --workers 4 --no-progress --overwrite > "$L/train_$1.log" 2>&1
    echo "train $1 rc $?"
}
for r in $RUNS; do
    e=$EPOCHS; [ "$r" = D ] && e=$(( EPOCHS * 2 ))
    train "$r" "$e" &
    pids="${pids:-} $!"
done
wait $pids
stamp trained; pack
for r in $RUNS; do
    cp "$W/runs/$r/log.jsonl" "$L/log_$r.jsonl" 2>/dev/null
    python3 -m sat_core.evaluate --checkpoint "$W/runs/$r/best" --data "$W/A/dataset.json" --images "$W/A" \
        --split val --beam 3 --length-norm 1 --no-meteor --device "$DEVICE" --generalisation "$W/vs" --no-shifted \
        --out "$OUT/val_$r.json" > "$L/eval_$r.log" 2>&1 &
    epids="${epids:-} $!"
done
wait $epids; [ -n "$smi" ] && kill $smi
stamp evaluated
pack; tail -n 3 "$L"/eval_*.log
ls -la "$OUT"
