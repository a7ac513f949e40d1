"""The default model for tables: numeric embeddings and an ensemble of MLPs in one network.

Built on the published work on MLPs that match gradient-boosted trees on tables without
tuning, as far as a network over the feature codec's matrix can take it:

- smooth clipping (RealMLP, Holzmueller et al. 2024): each standardised value `x` as
  `x / sqrt(1 + (x / 3)^2)`, so an outlier many deviations out reaches the network near
  +-3 and does not dominate a layer;
- periodic embeddings (PLR, Gorishniy et al. 2022): each input column `x` becomes
  `ReLU(W [cos(2 pi c x), sin(2 pi c x)] + b)` with trained frequencies `c`, per column,
  beside its clipped value: a threshold or a bump in one column is one unit away, which a
  plain MLP needs many for (what trees get for free). Above `tabular.max_embedded_width`
  input columns (wide tables), the columns go in as they are;
- an efficient ensemble (TabM-mini, Gorishniy et al. 2024): `tabular.ensemble_size`
  members share the MLP and differ by a multiplicative adapter on its input and their own
  output layer; each member is trained on its own loss, and the model predicts their mean
  probability (the network's eval output is the log of it: logits to softmax and argmax);
- dropout, label smoothing (RealMLP's defaults) and a learning rate that decays to zero by
  the run's last step along a cosine, so the last weights (the ones the pipeline
  registers) are those of a settled run.

The codec (preprocessing/contract/codec.py) has already standardised numbers and dates and
one-hot encoded strings, so the network needs nothing else to serve raw rows through the
pyfunc, and DDP and FSDP2 wrap it as they do the MLP (FSDP2 shards each child with
weights: the embedding, the shared MLP, the heads).
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from training.models.classifier import Classifier

CLIP = 3.0  # RealMLP's smooth clipping scale, in standard deviations


def smooth_clip(x: torch.Tensor) -> torch.Tensor:
    """`x / sqrt(1 + (x / CLIP)^2)`: near `x` close to 0, tending to +-CLIP; `hypot`, so
    that a value past 1e19 (whose square overflows float32) still maps to +-CLIP."""
    return x / torch.hypot(torch.ones_like(x), x / CLIP)


class PeriodicEmbedding(nn.Module):
    """[rows, columns] -> [rows, columns * (size + 1)]: each column's PLR embedding and its
    smoothly clipped value."""

    def __init__(self, columns: int, frequencies: int, size: int, scale: float) -> None:
        super().__init__()
        self.frequencies = nn.Parameter(torch.randn(columns, frequencies) * scale)
        bound = 1 / math.sqrt(2 * frequencies)
        self.weight = nn.Parameter(
            torch.empty(columns, 2 * frequencies, size).uniform_(-bound, bound)
        )
        self.bias = nn.Parameter(torch.empty(columns, size).uniform_(-bound, bound))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        clipped = smooth_clip(x)
        angles = 2 * math.pi * clipped[..., None] * self.frequencies
        periodic = torch.cat([torch.cos(angles), torch.sin(angles)], dim=-1)
        embedded = F.relu(torch.einsum("bcf,cfs->bcs", periodic, self.weight) + self.bias)
        return torch.cat([embedded.flatten(1), clipped], dim=1)


class SmoothClip(nn.Module):
    """Each value smoothly clipped (wide tables: their columns go in without embeddings)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return smooth_clip(x)


class EnsembleHeads(nn.Module):
    """[rows, members, width] -> [rows, members, classes]: each member's output layer."""

    def __init__(self, members: int, width: int, classes: int) -> None:
        super().__init__()
        bound = 1 / math.sqrt(width)
        self.weight = nn.Parameter(torch.empty(members, width, classes).uniform_(-bound, bound))
        self.bias = nn.Parameter(torch.empty(members, classes).uniform_(-bound, bound))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.einsum("bmw,mwc->bmc", hidden, self.weight) + self.bias


class TabularNet(nn.Module):
    """The network: embedding, the members' adapters, the shared MLP, their heads. In
    training mode it returns each member's logits [rows, members, classes]; in eval mode
    the log of their mean probability [rows, classes] (what serving and evaluation read)."""

    def __init__(
        self, num_features: int, num_classes: int, hidden_sizes: list[int], settings: dict
    ) -> None:
        super().__init__()
        members = settings["ensemble_size"]
        if num_features <= settings["max_embedded_width"]:
            self.embed: nn.Module = PeriodicEmbedding(
                num_features,
                settings["frequencies"],
                settings["embedding_size"],
                settings["frequency_scale"],
            )
            width = num_features * (settings["embedding_size"] + 1)
        else:
            self.embed, width = SmoothClip(), num_features
        # TabM's initialisation: the first adapter's entries +-1 at random, so the members
        # start apart while sharing every weight of the MLP.
        signs = torch.randint(0, 2, (members, width)).float() * 2 - 1
        self.adapters = nn.Parameter(signs)
        layers: list[nn.Module] = []
        for hidden in hidden_sizes:
            layers += [nn.Linear(width, hidden), nn.ReLU(), nn.Dropout(settings["dropout"])]
            width = hidden
        self.body = nn.Sequential(*layers)
        self.heads = EnsembleHeads(members, width, num_classes)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        embedded = self.embed(features)
        logits = self.heads(self.body(embedded[:, None, :] * self.adapters))
        if self.training:
            return cast(torch.Tensor, logits)
        members = logits.shape[1]
        return torch.logsumexp(F.log_softmax(logits.float(), dim=-1), dim=1) - math.log(members)


class TabularClassifier(Classifier):
    """The default model for tables (`model.class_path: tabular`): `TabularNet` with the
    widths of `model.hidden_sizes` and the settings of `model.tabular`."""

    def build_network(self, num_features: int, num_classes: int) -> nn.Module:
        settings = self.config.tabular.model_dump()
        return TabularNet(num_features, num_classes, self.config.hidden_sizes, settings)

    def training_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Each member's smoothed cross-entropy, weighted per sample, then their mean."""
        logits = self(batch["features"])
        members = logits.shape[1]
        losses = F.cross_entropy(
            logits.float().flatten(0, 1),
            batch["label"].repeat_interleave(members),
            reduction="none",
            label_smoothing=self.config.tabular.label_smoothing,
        ).view(-1, members)
        weight = batch["weight"]
        return (losses.mean(dim=1) * weight).sum() / weight.sum().clamp_min(1.0)

    def configure_optimizers(self) -> Any:
        """The optimizer of `model.optimizer`, its rate decaying along a cosine to zero by
        the run's last optimizer step (Lightning's estimate of the run's steps)."""
        optimizer = super().configure_optimizers()
        estimate = float(self.trainer.estimated_stepping_batches)
        if not math.isfinite(estimate):  # a loader of unknown length: the rate as set
            return optimizer
        total = max(1, int(estimate))
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * min(step, total) / total))
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}
