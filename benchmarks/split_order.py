"""Whether another split of the same global batches alone moves an MLP's per-step losses.

    .venv/bin/python benchmarks/split_order.py                 # 1,250 steps, about 2 min
    .venv/bin/python benchmarks/split_order.py --steps 20      # a quick look

`loader.balance: speed` gives the ranks other slices of the same global batch, and DDP
averages their gradients: the same mathematics as `equal`, summed in another order.
`hetero_bench` compares `speed`'s per-step losses with `equal`'s (target 1e-5, relative)
and on its MLP misses by far over 1,250 steps, while its token model meets it. This
benchmark tells the arithmetic from the balancer: one process, no DDP, no ballast data
path. hetero_bench's MLP ([512, 512], AdamW at lr 3e-3 and weight decay 1e-4, one
thread) trains on the same seeded batches of 512 rows; each step's gradient is summed
from rank slices as DDP sums it (each slice's mean loss x n_r W / N, averaged over W = 2
ranks). Printed, per dtype and split, against 256/256 (`equal`'s): the largest relative
per-step loss difference, the first step over 1e-5, and the difference at a few steps.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import time
from itertools import pairwise

import numpy as np
import torch
import torch.nn.functional as F

from training.models.classifier import build_mlp

ROWS, FEATURES, CLASSES, HIDDEN = 512, 16, 4, [512, 512]
SPLITS = ([384, 128], [400, 112], [256, 256])
TARGET = 1e-5


def batches(steps: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`steps` batches of ROWS rows: Gaussian features, labels from a noisy linear map."""
    generator = torch.Generator().manual_seed(seed)
    features = torch.randn(steps, ROWS, FEATURES, generator=generator)
    weights = torch.randn(FEATURES, CLASSES, generator=generator)
    noise = 0.5 * torch.randn(steps, ROWS, CLASSES, generator=generator)
    return features, (features @ weights + noise).argmax(-1)


def step_gradients(
    network: torch.nn.Module, features: torch.Tensor, labels: torch.Tensor, split: list[int]
) -> tuple[list[torch.Tensor], float]:
    """The step's gradients as DDP averages them over the ranks of `split`, and the step's
    mean loss (each rank's loss times its loss scale, averaged over ranks)."""
    summed: list[torch.Tensor] = []
    loss_sum, bounds = 0.0, np.cumsum([0, *split])
    for start, stop in pairwise(bounds):
        network.zero_grad()
        scale = (stop - start) * len(split) / ROWS
        loss = F.cross_entropy(network(features[start:stop]), labels[start:stop]) * scale
        loss.backward()
        loss_sum += loss.item()
        grads = [p.grad.detach().clone() for p in network.parameters() if p.grad is not None]
        summed = grads if not summed else [a + b for a, b in zip(summed, grads, strict=True)]
    return [grad / len(split) for grad in summed], loss_sum / len(split)


def train(
    split: list[int], dtype: torch.dtype, data: tuple[torch.Tensor, torch.Tensor]
) -> np.ndarray:
    """Each step's mean loss of a seeded run whose global batches are split by `split`."""
    torch.manual_seed(0)
    network = build_mlp(FEATURES, CLASSES, HIDDEN).to(dtype)
    optimizer = torch.optim.AdamW(network.parameters(), lr=3e-3, weight_decay=1e-4)
    losses = []
    for features, labels in zip(*data, strict=True):
        grads, loss = step_gradients(network, features.to(dtype), labels, split)
        for parameter, grad in zip(network.parameters(), grads, strict=True):
            parameter.grad = grad
        optimizer.step()
        losses.append(loss)
    return np.array(losses)


def report(dtype: torch.dtype, split: list[int], losses: np.ndarray, equal: np.ndarray) -> None:
    relative = np.abs(losses - equal) / np.abs(equal)
    over = np.nonzero(relative > TARGET)[0]
    first = int(over[0]) if len(over) else "none"
    marks = [step for step in (10, 100, 500, 1000) if step < len(relative)] + [len(relative) - 1]
    at = ", ".join(f"step {step} {relative[step]:.1e}" for step in marks)
    print(
        f"{dtype!s:14} {split[0]}/{split[1]} against 256/256: largest {relative.max():.2e}, "
        f"first over {TARGET:g}: {first}; {at}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1250, help="hetero_bench's 2 epochs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(1)
    data = batches(args.steps, args.seed)
    for dtype in (torch.float32, torch.float64):
        start = time.perf_counter()
        equal = train([256, 256], dtype, data)
        for split in SPLITS:
            report(dtype, split, train(split, dtype, data), equal)
        print(f"  ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
