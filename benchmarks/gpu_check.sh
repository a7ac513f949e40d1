#!/usr/bin/env bash
# One-GPU check of the training stack, under 8 minutes on a single CUDA GPU:
#   1. DDP and FSDP2 (ModelParallelStrategy, fully_shard per block) each train the
#      built-in transformer for one epoch on CUDA in bf16-mixed, one process
#      (torchrun --nproc-per-node 1), fed by the streaming loader (4 workers, pinned
#      memory); printed: samples/s, the stall fraction (share of wall time the
#      training step waited for a batch), peak GPU memory, final loss.
#   2. The same network, optimizer and batch size on synthetic batches already on
#      the GPU (no loader, no Lightning): the samples/s the GPU can take.
# A loader keeping up shows a stall fraction near 0 and samples/s close to (2).
# Without a CUDA GPU it says so and exits 0.
#
#   bash benchmarks/gpu_check.sh            # PYTHON=... to use another interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
ROWS=${ROWS:-131072}
BATCH=${BATCH:-256}
SEQ=128
VOCAB=8192

if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_check: no CUDA GPU is visible to torch here; nothing to check."
    exit 0
fi
"$PY" -c "import torch; print('gpu_check on', torch.cuda.get_device_name(0), 'torch', torch.__version__)"

WORK=$(mktemp -d -t ballast-gpu-check-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

timeout 120 "$PY" -m preprocessing.synthetic.tokens --out "$WORK/tokens" --rows "$ROWS" --holdout-rows 4096 \
    --seq-len "$SEQ" --vocab-size "$VOCAB" --num-classes 8 --rows-per-shard 32768 \
    --rows-per-row-group 2048 >/dev/null

MODEL="{class_path: transformer, learning_rate: 0.001,
        transformer: {vocab_size: $VOCAB, d_model: 512, num_layers: 6, num_heads: 8}}"
for strategy in ddp fsdp; do
    cat >"$WORK/$strategy.yaml" <<EOF
dataset: $WORK/tokens
output_dir: $WORK/$strategy
strategy: $strategy
precision: bf16-mixed
max_epochs: 1
loader: {batch_size: $BATCH, num_workers: 4}
model: $MODEL
EOF
    echo "--- $strategy (bf16-mixed, 1 process)"
    timeout 180 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 --max-restarts 0 \
        -m training --config "$WORK/$strategy.yaml" >"$WORK/$strategy.log" 2>&1 \
        || { tail -n 40 "$WORK/$strategy.log"; echo "gpu_check: $strategy FAILED"; exit 1; }
done

timeout 120 "$PY" - "$WORK" "$BATCH" "$SEQ" "$VOCAB" <<'EOF'
"""Synthetic batches on the GPU, then the table."""
import json
import sys
import time

import torch

from training.models.config import ModelConfig
from training.models.classifier import build_model, weighted_cross_entropy

work, batch, seq, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
config = ModelConfig(class_path="transformer", learning_rate=1e-3,
                     transformer={"vocab_size": vocab, "d_model": 512, "num_layers": 6,
                                  "num_heads": 8})
model = build_model(config, seq, list(range(8))).cuda()
optimizer = model.configure_optimizers()
features = torch.randint(0, vocab, (batch, seq), device="cuda").float()
label = torch.randint(0, 8, (batch,), device="cuda")
weight = torch.ones(batch, device="cuda")


def step() -> None:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = weighted_cross_entropy(model(features), label, weight)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


for _ in range(10):
    step()
torch.cuda.synchronize()
steps, started = 200, time.perf_counter()
for _ in range(steps):
    step()
torch.cuda.synchronize()
synthetic = steps * batch / (time.perf_counter() - started)

print(f"\n{'run':<22} {'samples/s':>10} {'stall':>7} {'peak GPU MiB':>13} {'loss':>8}")
for strategy in ("ddp", "fsdp"):
    summary = json.load(open(f"{work}/{strategy}/summary.json"))
    loader = summary["loader"]
    print(f"{strategy + ' + loader':<22} {loader['samples_per_s']:10.0f} "
          f"{loader['data_wait_fraction']:7.1%} "
          f"{max(summary['peak_memory_bytes_per_rank']) / 2**20:13.0f} "
          f"{summary['train_loss']:8.4f}")
print(f"{'synthetic, no loader':<22} {synthetic:10.0f} {'-':>7} "
      f"{torch.cuda.max_memory_allocated() / 2**20:13.0f} {'-':>8}")
EOF
