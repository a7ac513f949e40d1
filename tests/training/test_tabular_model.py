"""The `tabular` model (training/models/tabular.py) and init's proposal of it.

Invariants: smooth clipping maps every finite value, however large, into (-3, 3) and keeps
its sign; the network's eval output is a log-probability per class (its exponent sums to
1), finite for any finite input; its training output holds each member's logits, and the
training loss is the members' mean cross-entropy weighted per sample (padding of weight 0
counts for nothing); a table wider than `max_embedded_width` goes in without embeddings;
`ballast init` proposes the model with every one of its settings commented, and the
config validates.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
import torch.nn.functional as F
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from flows.cli.init_config import describe_inputs
from training.config import TrainConfig
from training.models.config import TabularConfig
from training.models.tabular import CLIP, PeriodicEmbedding, TabularClassifier, smooth_clip

FINITE = st.floats(allow_nan=False, allow_infinity=False, width=32)


@given(arrays(np.float32, (5, 3), elements=FINITE))
@settings(max_examples=200, deadline=None)
def test_smooth_clip_bounds_every_finite_value(values: np.ndarray) -> None:
    """Invariant: |clip(x)| < CLIP (or equal, where float32 rounds), sign kept, never
    NaN, for values up to float32's largest (whose squares overflow)."""
    x = torch.from_numpy(values)
    clipped = smooth_clip(x)
    assert torch.isfinite(clipped).all()
    assert (clipped.abs() <= CLIP).all()
    assert (torch.sign(clipped) == torch.sign(x)).all()


def model(num_features: int, num_classes: int = 3, **tabular: object) -> TabularClassifier:
    torch.manual_seed(0)
    config = {"class_path": "tabular", "hidden_sizes": [16], "tabular": tabular}
    return TabularClassifier(num_features, list(range(num_classes)), config)


@given(arrays(np.float32, (4, 6), elements=FINITE))
@settings(max_examples=100, deadline=None)
def test_eval_output_is_a_log_probability_for_any_finite_input(values: np.ndarray) -> None:
    """Invariant: in eval mode the network gives log-probabilities (the mean of the
    members'), finite and summing to 1 after exp, for hostile finite inputs."""
    net = model(6).net.eval()
    with torch.no_grad():
        out = net(torch.from_numpy(values))
    assert out.shape == (4, 3) and torch.isfinite(out).all()
    torch.testing.assert_close(out.exp().sum(dim=1), torch.ones(4))


def test_training_loss_is_the_members_mean_weighted_cross_entropy() -> None:
    """Invariant: with no label smoothing the loss is the mean over members of each
    sample's cross-entropy, weighted per sample; a padding row (weight 0) adds nothing."""
    classifier = model(4, ensemble_size=3, label_smoothing=0.0, dropout=0.0)
    classifier.train()
    features = torch.randn(5, 4)
    label = torch.tensor([0, 1, 2, 1, 0])
    weight = torch.tensor([1.0, 2.0, 1.0, 0.5, 0.0])
    batch = {"features": features, "label": label, "weight": weight}
    logits = classifier.net(features)
    assert logits.shape == (5, 3, 3)
    per_member = torch.stack(
        [F.cross_entropy(logits[:, m], label, reduction="none") for m in range(3)]
    )
    expected = (per_member.mean(dim=0) * weight).sum() / weight.sum()
    torch.testing.assert_close(classifier.training_loss(batch), expected)
    padded = {key: value[:4] for key, value in batch.items()}
    torch.testing.assert_close(classifier.training_loss(padded), expected)


def test_a_wide_table_goes_in_without_embeddings() -> None:
    """Invariant: past `max_embedded_width` columns no periodic embedding is built (its
    parameters grow with the columns); below it, one is."""
    assert isinstance(model(8, max_embedded_width=8).net.embed, PeriodicEmbedding)
    wide = model(9, max_embedded_width=8).net
    assert not isinstance(wide.embed, PeriodicEmbedding)
    assert wide.eval()(torch.randn(2, 9)).shape == (2, 3)


def test_init_proposes_the_tabular_model_with_its_settings_commented(tmp_path: Path) -> None:
    """Invariant: init's config names `tabular`, writes each of its settings with the
    field's description beside it, and validates as a training config."""
    rng = np.random.default_rng(0)
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(
        pa.table({"x": rng.normal(size=200), "label": rng.choice(["a", "b"], 200)}),
        raw / "part-0.parquet",
    )
    text = describe_inputs(str(raw), "label")
    config = yaml.safe_load(text.replace("${WORK_DIR}", str(tmp_path)))
    assert config["train"]["model"]["class_path"] == "tabular"
    for name, field in TabularConfig.model_fields.items():
        value = config["train"]["model"]["tabular"][name]
        assert f"      {name}: {value}  # {field.description}" in text
    TrainConfig.model_validate(config["train"])
