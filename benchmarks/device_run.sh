#!/usr/bin/env bash
# The prepared GPU run of benchmarks/sample_efficiency.py (see docs/benchmarks.md for its estimated cost).
# The device machine has no Hub access and no embedded model, so the policy is SmolLM2-135M's architecture with
# random weights and a byte-level tokenizer, on the `digits` task, which is learnable from a random start.
# Usage: bash benchmarks/device_run.sh [output folder]   (default: $OUT if set, else benchmarks/results)
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
OUT_DIR="${1:-${OUT:-benchmarks/results}}"
python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'; print(torch.cuda.get_device_name(0))"
python benchmarks/sample_efficiency.py --model random-smollm2 --task digits --seeds 0 1 2 --steps 40 \
    --prompts-per-step 16 --max-completion-length 32 --learning-rate 1e-4 --eval-every 10 --num-test 64 \
    --out "$OUT_DIR" 2>&1 | grep -v -i warn
