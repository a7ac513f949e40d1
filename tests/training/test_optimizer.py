"""The built-in classifier's optimizer: AdamW on torch's fused kernel where every parameter
allows it (training/models/classifier.py), the same update as the single-tensor loop to a
few ulps, and the single-tensor loop kept for parameters the kernel does not take."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from training.models.classifier import FeatureClassifier, fused_adam_applies

MODEL = {"hidden_sizes": [64, 64], "optimizer": "adamw", "learning_rate": 3e-3}


def losses_of(fused: bool, steps: int = 100) -> list[float]:
    """The loss at each of `steps` AdamW steps of one seeded classifier on seeded batches."""
    torch.manual_seed(0)
    model = FeatureClassifier(16, ["a", "b", "c"], MODEL)
    optimizer = model.configure_optimizers()
    for group in optimizer.param_groups:
        group["fused"] = fused
    batches = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        features = torch.randn(32, 16, generator=batches)
        label = torch.randint(0, 3, (32,), generator=batches)
        loss = F.cross_entropy(model(features), label)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def test_the_classifiers_adamw_takes_the_fused_kernel_on_cpu() -> None:
    model = FeatureClassifier(16, ["a", "b"], MODEL)
    assert all(group["fused"] for group in model.configure_optimizers().param_groups)


def test_the_fused_update_is_the_single_tensor_one_to_1e_6_over_100_steps() -> None:
    fused, single = losses_of(fused=True), losses_of(fused=False)
    assert max(abs(a - b) for a, b in zip(fused, single, strict=True)) < 1e-6


def test_parameters_the_kernel_does_not_take_keep_torchs_default() -> None:
    """None at all, or one on a device without the kernel (meta stands for such a one):
    the optimizer is built as torch builds it by default (fused left None, not False,
    which would also turn off the foreach loop torch picks on some devices)."""
    assert fused_adam_applies([torch.zeros(3)])
    assert not fused_adam_applies([])
    assert not fused_adam_applies([torch.zeros(3), torch.zeros(3, device="meta")])
    model = FeatureClassifier(16, ["a", "b"], MODEL).to("meta")
    assert all(group["fused"] is None for group in model.configure_optimizers().param_groups)
