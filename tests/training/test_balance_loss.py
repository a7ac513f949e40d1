"""The loss under a balanced split, restated (training/data/balance.py, `rank_slice`'s
`loss_scale`; the model's weighted loss, training/models/classifier.py): each rank's mean
loss times n_r W / N, the gradients averaged over ranks as DDP averages them, is the
global step's mean loss whatever the split. So `speed`'s per-step losses are exactly
those of its splits replayed by hand (`fixed` at each step's split: the balancer adds
nothing of its own), and in float64 any split's losses stay within 1e-12 of `equal`'s:
in float32 they drift apart from the order of the sums alone (benchmarks/split_order.py)."""

from __future__ import annotations

import numpy as np
import torch

from training.data.balance import SharePlan, rank_slice, row_bounds
from training.models.classifier import build_mlp, weighted_cross_entropy

ROWS, FEATURES, CLASSES, STEPS, WORLD = 64, 8, 3, 80, 2


def global_steps() -> list[dict[str, torch.Tensor]]:
    """Seeded global steps of ROWS rows; the last one padded: its last 10 rows weigh 0."""
    generator = torch.Generator().manual_seed(7)
    steps = []
    for index in range(STEPS):
        features = torch.randn(ROWS, FEATURES, generator=generator, dtype=torch.float64)
        label = (features[:, :CLASSES] + 0.3 * features[:, CLASSES:].sum(1, keepdim=True)).argmax(1)
        weight = torch.ones(ROWS, dtype=torch.float64)
        if index == STEPS - 1:
            weight[-10:] = 0.0
        steps.append(
            {"id": torch.arange(ROWS), "features": features, "label": label, "weight": weight}
        )
    return steps


def train(splits: list[np.ndarray]) -> np.ndarray:
    """Each step's global mean loss of a seeded float64 MLP whose step k is cut by
    splits[k], each rank's loss times its loss_scale, gradients averaged over ranks."""
    torch.manual_seed(0)
    network = build_mlp(FEATURES, CLASSES, [16]).to(torch.float64)
    optimizer = torch.optim.AdamW(network.parameters(), lr=1e-2, weight_decay=1e-4)
    losses = []
    for whole, shares in zip(global_steps(), splits, strict=True):
        grads: list[torch.Tensor] = []
        step_loss = 0.0
        for rank in range(WORLD):
            part = rank_slice(whole, shares, rank, "samples")
            network.zero_grad()
            logits = network(part["features"])
            loss = weighted_cross_entropy(logits, part["label"], part["weight"])
            loss = loss * part["loss_scale"].to(loss.dtype)  # as the model does
            loss.backward()
            step_loss += loss.item() / WORLD
            mine = [p.grad.detach().clone() for p in network.parameters() if p.grad is not None]
            grads = mine if not grads else [a + b for a, b in zip(grads, mine, strict=True)]
        for parameter, grad in zip(network.parameters(), grads, strict=True):
            parameter.grad = grad / WORLD
        optimizer.step()
        losses.append(step_loss)
    return np.array(losses)


def speed_splits() -> list[np.ndarray]:
    """The splits a `speed` SharePlan gives step by step while rank 1 is modelled 3x
    slower a row from step 20 on (re-planned every 4 steps): equal, then moving."""
    plan, splits = SharePlan(), []
    samples, busy = np.zeros(WORLD), np.zeros(WORLD)
    for step in range(STEPS):
        shares = plan.shares_at(0, step * ROWS, WORLD)
        splits.append(shares)
        rows = np.diff(row_bounds(shares, ROWS)).astype(float)
        samples += rows
        busy += 1e-3 + rows * np.array([1e-4, 3e-4 if step >= 20 else 1e-4])
        if (step + 1) % 4 == 0:
            plan.replan(0, (step + 1) * ROWS, ROWS, list(samples), list(busy))
            samples[:], busy[:] = 0, 0
    return splits


def test_speed_loses_nothing_beyond_its_splits_and_float64_keeps_equals_loss() -> None:
    """Invariant: `speed`'s per-step losses (its splits moving during the run) are bit for bit
    those of the same splits replayed by hand, so per step they differ from `equal`'s by
    exactly as much as the hand-fixed splits do; in float64 every step's loss of `speed`,
    and of a split fixed at 3/4 and 1/4, is within 1e-12 (relative) of `equal`'s, the
    padded last step included."""
    moving = speed_splits()
    assert len({tuple(np.round(shares, 6)) for shares in moving}) >= 2  # the split moved
    equal = train([np.full(WORLD, 1 / WORLD)] * STEPS)
    speed = train(moving)
    by_hand = train([np.array([float(s) for s in shares]) for shares in moving])
    fixed = train([np.array([0.75, 0.25])] * STEPS)
    assert np.array_equal(speed, by_hand)
    assert np.array_equal(np.abs(speed - equal), np.abs(by_hand - equal))
    for losses in (speed, fixed):
        assert np.max(np.abs(losses - equal) / np.abs(equal)) <= 1e-12
    assert equal[-1] != equal[-2]  # the steps train: the losses are not one constant
