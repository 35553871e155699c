#!/usr/bin/env bash
# The prepared GPU run: a conclusion on OTB's cost in about 8 minutes of run time on one GPU, each part writing its
# JSON before the next starts:
#   1. whole-step overhead, OTBTrainer vs GRPOTrainer, bf16, Qwen2.5-0.5B shapes (random init), 256 completion
#      tokens: each trainer built and warmed up once (warm-up untimed), then >= 5 interleaved (ABBA) step pairs
#                                                                                 -> device_overhead.json
#   2. the advantages on the GPU at 2.1M and 8.4M tokens against the floor      -> device_advantages_speed.json
#   3. the rollout pass and the loss step with TRL's fused LM head, with and without log_sum_sq_probs, at 1024 and
#      4096 tokens: the parts OTB changes, timed apart from generation, which dominates a whole step at those
#      lengths                                                                   -> device_fused_head.json
#   4. the conclusion: the verdict and one line per measurement                 -> device_conclusion.json
# The sample-efficiency job is not part of it (it did not finish inside a lent GPU's time): run
# `python -m benchmarks.sample_efficiency --model random-smollm2 ...` on a machine of your own.
# The machine has torch, transformers, peft and accelerate but no trl, no datasets and no Hub: missing packages are
# installed from the wheels in .whl/ (how to fetch them: docs/benchmarks.md) into /tmp/site.
#
# Usage: bash benchmarks/device_run.sh [--dry-run] [--budget SECONDS] [output folder]
#   output folder: default $OUT if set, else benchmarks/results
#   --budget: the whole run's seconds (default 480); parts 1 to 3 get fixed shares, the conclusion always runs
#   --dry-run: on a CPU, tiny shapes and sizes, the same scripts and code paths (tests/benchmarks/test_device_run.py)
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
BUDGET=480
OUT_DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --budget) BUDGET="$2"; shift ;;
        -*) echo "unknown option $1" >&2; exit 2 ;;
        *) OUT_DIR="$1" ;;
    esac
    shift
done
OUT_DIR="${OUT_DIR:-${OUT:-benchmarks/results}}"
mkdir -p "$OUT_DIR"
exec > >(tee "$OUT_DIR/device_run.log") 2>&1  # the whole log next to the results
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
PY="${PYTHON:-python3}"

# 0. Packages: trl and datasets (and datasets' dill and multiprocess) from .whl/ where they are missing.
if ! "$PY" -c "import trl, datasets" 2>/dev/null; then
    if ! ls .whl/*.whl >/dev/null 2>&1; then
        echo "trl or datasets is missing and .whl/ holds no wheels: fetch them as docs/benchmarks.md says" >&2
        exit 1
    fi
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c "import torch, transformers, trl, datasets, trl_otb
print('torch', torch.__version__, 'transformers', transformers.__version__, 'trl', trl.__version__,
      'cuda', torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none')" || exit 1

if [ "$DRY" = 1 ]; then
    DEVICE=cpu
    OVERHEAD_ARGS=(--dry-run)
    SPEED_ARGS=(--device cpu --sizes 16x8x64 --repeats 2)
    FUSED_ARGS=(--dry-run)
else
    DEVICE=cuda
    "$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device (use --dry-run on a CPU)'" || exit 1
    OVERHEAD_ARGS=(--shape qwen2.5-0.5b --lengths 256 --pairs 6 --warmup 1 --budget-s $((BUDGET * 40 / 100)))
    SPEED_ARGS=(--device cuda --sizes 128x8x2048 128x8x8192 --repeats 9)
    FUSED_ARGS=(--shape qwen2.5-0.5b --lengths 1024 4096 --batch 8 --repeats 10)
fi

# part NAME SHARE_PERCENT COMMAND...: runs COMMAND under a time limit of SHARE_PERCENT of the budget (0: whatever is
# left), never past the budget; a part that fails or runs out of time does not stop the next one.
part() {
    local name="$1" share="$2"
    shift 2
    local left=$((BUDGET - SECONDS)) limit
    limit=$((share > 0 ? BUDGET * share / 100 : left))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -lt 20 ]; then
        echo "== $name: skipped, ${left} s of the ${BUDGET} s budget left"
        return
    fi
    echo "== $name (at most ${limit} s; ${SECONDS} s elapsed)"
    timeout -k 10 "$limit" "$@"
    local rc=$?
    [ $rc -ne 0 ] && echo "== $name: exit status $rc (124: out of time)"
    echo "== $name done at ${SECONDS} s"
}

part "1. whole-step overhead" 50 "$PY" -m benchmarks.device_bench overhead "${OVERHEAD_ARGS[@]}" --out "$OUT_DIR"
part "2. estimator speed" 10 "$PY" -m benchmarks.advantages_speed "${SPEED_ARGS[@]}" --stem device_advantages_speed \
    --out "$OUT_DIR"
part "3. rollout pass and loss step with sum pi^2" 25 "$PY" -m benchmarks.device_bench fused-head "${FUSED_ARGS[@]}" \
    --out "$OUT_DIR"
echo "== 4. conclusion (${SECONDS} s elapsed)"
timeout -k 10 60 "$PY" -m benchmarks.device_bench conclude --out "$OUT_DIR" || echo "== 4. conclusion: exit status $?"
echo "== 4. conclusion done at ${SECONDS} s"
echo "device_run ($DEVICE) finished in ${SECONDS} s; results in $OUT_DIR"
