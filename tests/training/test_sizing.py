"""The size rule `ballast init` proposes training by (training/sizing.py): monotone in the
rows, and written into the config as settings that read back to the same model."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from flows.cli.main import main
from flows.params import PipelineParams
from training.config import TrainConfig
from training.models.config import TabularConfig
from training.sizing import (
    ENSEMBLE_ROWS,
    FINE_ROWS,
    LEARNING_RATE,
    MAX_EPOCHS,
    MAX_MEMBERS,
    MAX_RATE_BOOST,
    MIN_BATCH,
    MIN_EPOCHS,
    TARGET_STEPS,
    ensemble_size,
    sized_training,
)

rows = st.integers(min_value=0, max_value=10**10)


@given(rows, rows)
def test_the_rule_is_monotone_in_the_rows(a: int, b: int) -> None:
    """Invariants: more training rows never get more ensemble members, a smaller batch,
    narrower layers or coarser periodic embeddings (a smaller frequency scale); the epochs
    stay within [MIN_EPOCHS, MAX_EPOCHS] and are the fewest that reach TARGET_STEPS
    optimizer steps."""
    small, large = sorted((a, b))
    few, many = sized_training(small), sized_training(large)
    assert ensemble_size(large) <= ensemble_size(small)
    assert many["model"]["tabular"]["ensemble_size"] <= few["model"]["tabular"]["ensemble_size"]
    assert many["loader"]["batch_size"] >= few["loader"]["batch_size"]
    assert many["model"]["hidden_sizes"][0] >= few["model"]["hidden_sizes"][0]
    scales = [sized["model"]["tabular"]["frequency_scale"] for sized in (few, many)]
    assert scales[1] >= scales[0]
    for count, sized in ((small, few), (large, many)):
        epochs, steps = sized["max_epochs"], max(count, 1) / sized["loader"]["batch_size"]
        assert MIN_EPOCHS <= epochs <= MAX_EPOCHS
        assert epochs == MAX_EPOCHS or epochs * steps >= TARGET_STEPS * (1 - 1e-12)
        assert epochs == MIN_EPOCHS or (epochs - 1) * steps < TARGET_STEPS * (1 + 1e-12)


@given(st.integers(min_value=0, max_value=10**9))
def test_the_epochs_fall_smoothly_with_the_rows(n: int) -> None:
    """Invariant: one more training row never gets more epochs, nor one fewer epoch less
    than one: no jump where the batch widens (it was 5 epochs at 19,999 rows and 20 at
    20,000, where the batch stepped from 64 to 256), nor anywhere else."""
    epochs, more = (sized_training(count)["max_epochs"] for count in (n, n + 1))
    assert epochs - 1 <= more <= epochs


@given(rows)
def test_outside_the_batch_ramp_the_proposal_is_what_it_was(n: int) -> None:
    """Invariant: up to 5,000 training rows (batch MIN_BATCH) and from FINE_ROWS, the batch
    and epochs are those of the rule before the ramp (64 a batch under 20,000 rows, 256 to
    500,000, then 1,024; 1,500 steps of it within [4, 40] epochs), so the figures measured
    with it hold there: every table of the suite but star (5,173 training rows)."""
    sized = sized_training(n)
    rows = max(n, 1)
    before = 64 if rows < FINE_ROWS else 256 if rows < 500_000 else 1024
    epochs = min(max(math.ceil(TARGET_STEPS * before / rows), MIN_EPOCHS), MAX_EPOCHS)
    if rows <= 5_000 or rows >= FINE_ROWS:
        assert (sized["loader"]["batch_size"], sized["max_epochs"]) == (before, epochs)
    else:
        assert MIN_BATCH < sized["loader"]["batch_size"] <= 256
        assert sized["max_epochs"] == 20


@given(rows, rows)
def test_the_rate_makes_up_the_steps_the_epochs_cap(a: int, b: int) -> None:
    """Invariants: where the epochs reach TARGET_STEPS optimizer steps, the rate is
    LEARNING_RATE, as init proposed before (so the figures measured with it hold there:
    every table from about 2,400 training rows); where MAX_EPOCHS caps them short of it,
    the rate times the run's steps makes up the budget (to the rate's 3 significant
    digits), at most MAX_RATE_BOOST x LEARNING_RATE; more rows never get a higher rate."""
    small, large = sorted((a, b))
    few, many = sized_training(small), sized_training(large)
    assert many["model"]["learning_rate"] <= few["model"]["learning_rate"]
    for count, sized in ((small, few), (large, many)):
        rate = sized["model"]["learning_rate"]
        steps = sized["max_epochs"] * max(count, 1) / sized["loader"]["batch_size"]
        assert LEARNING_RATE <= rate <= MAX_RATE_BOOST * LEARNING_RATE
        if steps >= TARGET_STEPS:
            assert rate == LEARNING_RATE
        else:
            assert sized["max_epochs"] == MAX_EPOCHS
            budget = min(TARGET_STEPS, MAX_RATE_BOOST * steps) * LEARNING_RATE
            assert rate * steps == pytest.approx(budget, rel=5e-3)


@given(rows)
def test_the_ensemble_keeps_its_default_up_to_the_threshold_and_bounds_the_work(n: int) -> None:
    """Invariant: up to ENSEMBLE_ROWS training rows init proposes the model's default
    members (so what it proposes for small tables is unchanged); above, an epoch's
    member-rows stay within MAX_MEMBERS x ENSEMBLE_ROWS unless one member is left, and
    the members are the most (a power of two) that fit it."""
    members = ensemble_size(n)
    assert MAX_MEMBERS == TabularConfig().ensemble_size == 8
    assert 1 <= members <= MAX_MEMBERS and members & (members - 1) == 0
    if n <= ENSEMBLE_ROWS:
        assert members == MAX_MEMBERS
    assert members == 1 or members * n <= MAX_MEMBERS * ENSEMBLE_ROWS
    if members < MAX_MEMBERS:
        assert 2 * members * n > MAX_MEMBERS * ENSEMBLE_ROWS


@given(rows)
def test_the_embeddings_keep_the_default_scale_below_the_threshold(n: int) -> None:
    """Invariant: under FINE_ROWS training rows init proposes the model's default frequency
    scale (what it proposes for small tables is unchanged); from there a scale above it."""
    scale = sized_training(n)["model"]["tabular"]["frequency_scale"]
    default = TabularConfig().frequency_scale
    assert scale == default if n < FINE_ROWS else scale > default


@pytest.mark.parametrize(
    ("num_rows", "training", "members", "scale"),
    [(800, 720, 8, 0.1), (3_000, 2_700, 8, 0.1), (120_000, 96_000, 4, 1.0)],
)
def test_init_writes_the_sized_ensemble_and_it_reads_back(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    num_rows: int,
    training: int,
    members: int,
    scale: float,
) -> None:
    """Invariant: the config `ballast init` prints holds the rule's epochs, learning rate,
    members and frequency scale for its training rows (800 rows: 720 training rows, twice
    the rate; 3,000 rows: 2,700 training rows, 8 and 0.1; 120,000 rows: 96,000, 4 and
    1.0) as explicit, commented settings; the config
    validates, and dumped and validated again it is the same training config (a written
    config keeps its meaning)."""
    generator = np.random.default_rng(0)
    table = pa.table(
        {
            "x": generator.normal(size=num_rows),
            "colour": generator.choice(["red", "blue"], size=num_rows),
            "label": generator.integers(0, 2, size=num_rows),
        }
    )
    (tmp_path / "raw").mkdir()
    pq.write_table(table, tmp_path / "raw" / "part-0.parquet")
    assert main(["init", "--inputs", str(tmp_path / "raw")]) == 0
    text = capsys.readouterr().out
    assert f"ensemble_size: {members}  # Members sharing the MLP" in text
    assert f"init: {MAX_MEMBERS} up to {ENSEMBLE_ROWS:,} training rows" in text
    assert f"frequency_scale: {scale}  # Periodic embedding" in text
    assert f"0.1 under {FINE_ROWS:,} training rows" in text
    epochs = sized_training(training)["max_epochs"]
    assert f"max_epochs: {epochs}  # init: the epochs of about {TARGET_STEPS:,} steps" in text
    rate = sized_training(training)["model"]["learning_rate"]
    assert rate == (2 * LEARNING_RATE if training < 1_000 else LEARNING_RATE)
    assert f"learning_rate: {rate}  # init: {LEARNING_RATE:g}, x {TARGET_STEPS:,} / the" in text
    params = PipelineParams.model_validate(yaml.safe_load(text.replace("${WORK_DIR}", "/w")))
    assert params.train.model.tabular.ensemble_size == members
    assert params.train.model.tabular.frequency_scale == scale
    assert params.train.model.class_path == "tabular"
    assert params.train.model.learning_rate == rate
    again = TrainConfig.model_validate(params.train.model_dump())
    assert again == params.train
