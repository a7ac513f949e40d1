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
    MAX_EPOCHS,
    MAX_MEMBERS,
    MIN_EPOCHS,
    TARGET_SAMPLES,
    ensemble_size,
    sized_training,
)

rows = st.integers(min_value=0, max_value=10**10)


@given(rows, rows)
def test_the_rule_is_monotone_in_the_rows(a: int, b: int) -> None:
    """Invariants: more training rows never get more ensemble members, a smaller batch,
    narrower layers or coarser periodic embeddings (a smaller frequency scale); the epochs
    stay within [MIN_EPOCHS, MAX_EPOCHS] and are the fewest that see TARGET_SAMPLES rows."""
    small, large = sorted((a, b))
    few, many = sized_training(small), sized_training(large)
    assert ensemble_size(large) <= ensemble_size(small)
    assert many["model"]["tabular"]["ensemble_size"] <= few["model"]["tabular"]["ensemble_size"]
    assert many["loader"]["batch_size"] >= few["loader"]["batch_size"]
    assert many["model"]["hidden_sizes"][0] >= few["model"]["hidden_sizes"][0]
    scales = [sized["model"]["tabular"]["frequency_scale"] for sized in (few, many)]
    assert scales[1] >= scales[0]
    for count, sized in ((small, few), (large, many)):
        epochs, seen = sized["max_epochs"], max(count, 1)
        assert MIN_EPOCHS <= epochs <= MAX_EPOCHS
        assert epochs == MAX_EPOCHS or epochs * seen >= TARGET_SAMPLES
        assert epochs == MIN_EPOCHS or (epochs - 1) * seen < TARGET_SAMPLES


@given(st.integers(min_value=0, max_value=10**9))
def test_the_epochs_fall_smoothly_with_the_rows(n: int) -> None:
    """Invariant: one more training row never gets more epochs, nor one fewer epoch less
    than one: no jump where the batch widens (it was 5 epochs at 19,999 rows and 20 at
    20,000, when the budget was steps of whatever batch), nor anywhere else."""
    epochs, more = (sized_training(count)["max_epochs"] for count in (n, n + 1))
    assert epochs - 1 <= more <= epochs


@pytest.mark.parametrize("n", [FINE_ROWS - 1, FINE_ROWS, 43_146, 303_000, 2_000_000])
def test_large_tables_keep_the_epochs_and_batch_they_had(n: int) -> None:
    """Invariant: from FINE_ROWS training rows the proposal is what it was (1,500 steps of
    its batch, at least MIN_EPOCHS: diamonds' 43,146 rows 9 epochs of 256, flights' 4), so
    their measured figures hold; below, the batch is 64 and the epochs see the same rows
    as 1,500 steps of 256 would, where the epochs were 4x fewer (5 at 19,999 rows)."""
    sized = sized_training(n)
    batch = sized["loader"]["batch_size"]
    large = min(max(math.ceil(1_500 * batch / n), MIN_EPOCHS), 40)
    if n >= FINE_ROWS:
        assert sized["max_epochs"] == large
    else:
        assert (batch, sized["max_epochs"]) == (64, 20)


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


@pytest.mark.parametrize(("num_rows", "members", "scale"), [(3_000, 8, 0.1), (120_000, 4, 1.0)])
def test_init_writes_the_sized_ensemble_and_it_reads_back(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    num_rows: int,
    members: int,
    scale: float,
) -> None:
    """Invariant: the config `ballast init` prints holds the rule's members and frequency
    scale for its training rows (3,000 rows: 8 and 0.1; 120,000 rows: 96,000 training
    rows, 4 and 1.0) as explicit, commented settings; the config validates, and dumped and
    validated again it is the same training config (a written config keeps its meaning)."""
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
    params = PipelineParams.model_validate(yaml.safe_load(text.replace("${WORK_DIR}", "/w")))
    assert params.train.model.tabular.ensemble_size == members
    assert params.train.model.tabular.frequency_scale == scale
    assert params.train.model.class_path == "tabular"
    again = TrainConfig.model_validate(params.train.model_dump())
    assert again == params.train
