#!/usr/bin/env bash
# The estimator study's pre-screen: the yardstick of every estimator on the six variance cells and the real model's
# count pool, at the initial policy and at a partly trained one (README.md). Every run whose JSON is already here is
# skipped; pools and checkpoints are cached under .cache/, so a stopped run resumes where it stopped.
#   bash research/estimator_study/prescreen/run.sh            # everything not yet done, one process at a time
#   bash research/estimator_study/prescreen/run.sh ramble     # only the runs whose stem contains "ramble"
set -euo pipefail
cd "$(dirname "$0")/../../.."
export HF_HUB_OFFLINE=1 PYTHONPATH=.
OUT=research/estimator_study/prescreen
PY=".venv/bin/python"
ONLY="${1:-}"
REACH=(--task count --pool 12 --horizons 256 --temperature 0.7 --cache .cache/variance_reach
       --count-targets 36 38 40 42 44 46 48 50 52 54 56 58 60 62 64)
COUNT=(--task count --pool 12 --horizons 256 512 1024)
MATH=(--task math --horizons 64 256 --spaces lm_head)
RAMBLE=(--task study-ramble --seed 0 --cache .cache/training_study/variance)
LONG_RIGHT=(--task study-long_right --seed 0 --cache .cache/training_study/variance --Ns 4 --groups 400)
COPY=(--task study-copy --seed 0 --cache .cache/training_study/variance --Ns 4 --groups 400)

run() {  # run STEM ARGS...: one variance run unless its JSON exists
  local stem=$1; shift
  [[ -n "$ONLY" && "$stem" != *"$ONLY"* ]] && return 0
  [[ -f "$OUT/$stem.json" ]] && { echo "done: $stem"; return 0; }
  echo "running: $stem"
  nice -n 19 $PY -m benchmarks.variance "$@" --yardstick --stem "$stem" --out "$OUT"
  rm -f "$OUT/$stem.png"  # the variance figure: the yardstick is in the JSON
}

checkpoint() {  # checkpoint NAME: the partly trained policy (checkpoint.py) unless it exists
  [[ -f ".cache/estimator_study/$1_grpo.pt" ]] || nice -n 19 $PY "$OUT/checkpoint.py" "$1"
}

run prescreen_ramble_init "${RAMBLE[@]}"
if [[ -z "$ONLY" || "prescreen_ramble_trained" == *"$ONLY"* ]]; then checkpoint ramble; fi
run prescreen_ramble_trained "${RAMBLE[@]}" --checkpoint .cache/estimator_study/ramble_grpo.pt
# N = 4 (the study's arms) with 400 groups per prompt: cos to about +-0.01, for the gate (cos >= 0.99)
run prescreen_ramble_init_n4g400 "${RAMBLE[@]}" --Ns 4 --groups 400
run prescreen_ramble_trained_n4g400 "${RAMBLE[@]}" --Ns 4 --groups 400 --checkpoint .cache/estimator_study/ramble_grpo.pt
# the other two training tasks (study 4's long_right and short cells), N = 4 with 400 groups as ramble's gate runs
run prescreen_long_right_init "${LONG_RIGHT[@]}"
if [[ -z "$ONLY" || "prescreen_long_right_trained" == *"$ONLY"* ]]; then checkpoint long_right; fi
run prescreen_long_right_trained "${LONG_RIGHT[@]}" --checkpoint .cache/estimator_study/long_right_grpo.pt
run prescreen_copy_init "${COPY[@]}"
if [[ -z "$ONLY" || "prescreen_copy_trained" == *"$ONLY"* ]]; then checkpoint copy; fi
run prescreen_copy_trained "${COPY[@]}" --checkpoint .cache/estimator_study/copy_grpo.pt
run prescreen_reach_init "${REACH[@]}"
run prescreen_math_init "${MATH[@]}"
run prescreen_count_init "${COUNT[@]}"
if [[ -z "$ONLY" || "prescreen_reach_trained prescreen_math_trained prescreen_count_trained" == *"$ONLY"* ]]; then
  checkpoint count
fi
run prescreen_reach_trained "${REACH[@]}" --checkpoint .cache/estimator_study/count_grpo.pt
run prescreen_math_trained "${MATH[@]}" --checkpoint .cache/estimator_study/count_grpo.pt
run prescreen_count_trained "${COUNT[@]}" --checkpoint .cache/estimator_study/count_grpo.pt
