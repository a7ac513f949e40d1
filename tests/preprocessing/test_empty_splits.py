"""Every shuffle mode works with either split empty or tiny: the pure plan and routing
(a property test over both splits), and one real reshard per mode with no holdout."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from distributed import Client
from hypothesis import example, given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import read_manifest, shard_uri
from preprocessing.driver.reshard import run_reshard
from preprocessing.plan.counts import Counts
from preprocessing.plan.row_fates import route_rows
from preprocessing.plan.split import SHUFFLE_MODES, SPLITS, plan_split

# Per row: (class, held out); a piece is a run of rows.
# (label, split code: train, holdout, validation)
rows_strategy = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, len(SPLITS) - 1)), min_size=0, max_size=12
)


def route_split(
    rows: list[tuple[int, int]],
    cuts: int,
    split: str,
    mode: str,
    output: int | None,
    shard_rows: int,
) -> tuple[object, np.ndarray, np.ndarray]:
    """Plan one split of `rows` cut into `cuts` + 1 pieces and route every piece's rows of
    it: (plan, input row of each output row, its shard)."""
    held, code = split != "train", SPLITS.index(split)  # held: kept as drawn, unresampled
    bounds = np.linspace(0, len(rows), cuts + 2).astype(int)
    pieces = [list(range(a, b)) for a, b in pairwise(bounds)]
    records = Counter(
        (p, SPLITS[rows[i][1]], rows[i][0], "s")
        for p, members in enumerate(pieces)
        for i in members
    )
    counts = Counts.of([(*key, n) for key, n in sorted(records.items())])
    mix = None if held else MixConfig()
    plan = plan_split(
        counts, split, mix, None if held else output, shard_rows, mode, 3, len(pieces)
    )
    index = {stratum: i for i, stratum in enumerate(plan.strata)}
    ids, shards = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for p, members in enumerate(pieces):
        mine = np.array([i for i in members if rows[i][1] == code], dtype=np.int64)
        if not len(mine):
            continue
        offsets = np.zeros(len(plan.strata), dtype=np.int64)
        for stratum, offset in plan.piece_offsets.of_piece(p).items():
            offsets[stratum] = offset
        codes = np.array([index[(rows[i][0], "s")] for i in mine], dtype=np.int64)
        routing = route_rows(codes, offsets, plan, 3, p)
        ids.append(mine[routing.rows])
        shards.append(routing.shards)
    return plan, np.concatenate(ids), np.concatenate(shards)


@given(
    rows=rows_strategy,
    cuts=st.integers(0, 3),
    split=st.sampled_from(SPLITS),
    mode=st.sampled_from(SHUFFLE_MODES),
    output=st.integers(1, 9),
    shard_rows=st.integers(1, 4),
)
@example(rows=[(0, 0), (1, 0)], cuts=1, split="holdout", mode="block", output=2, shard_rows=1)
@example(rows=[(0, 1)], cuts=0, split="train", mode="none", output=1, shard_rows=2)
@example(rows=[(0, 2), (1, 1)], cuts=1, split="validation", mode="none", output=1, shard_rows=1)
@settings(max_examples=300, deadline=None)
def test_every_mode_plans_and_routes_an_empty_or_tiny_split_exactly(
    rows, cuts, split, mode, output, shard_rows
) -> None:
    """Invariant: in every shuffle mode, a split with no rows, or a few, plans without error;
    the rows routed to each shard are exactly the plan's; an empty split plans no rows;
    the holdout and the validation split keep every one of their rows exactly once."""
    plan, ids, shards = route_split(rows, cuts, split, mode, output, shard_rows)
    members = [i for i, (_, code) in enumerate(rows) if code == SPLITS.index(split)]
    assert np.array_equal(np.bincount(shards, minlength=plan.num_shards), plan.shard_rows())
    assert len(ids) == plan.num_output_rows
    if not members:
        assert plan.num_output_rows == 0
    elif split != "train":
        assert sorted(ids.tolist()) == members
    else:
        assert plan.num_output_rows == output


@pytest.mark.slow
@pytest.mark.parametrize("mode", SHUFFLE_MODES)
def test_a_reshard_with_no_holdout_commits_in_every_mode(
    mode, tiny_raw: Path, tmp_path, dask_client: Client
) -> None:
    """Invariant: with holdout_fraction 0, every shuffle mode commits a version whose only
    split is train, holding the planned rows in shards of at most target_shard_rows."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)], id_column="id"),
        output_root=str(tmp_path / "out"),
        shuffle=mode,
        holdout_fraction=0.0,
        num_output_rows=1_000,
        target_shard_rows=300,
    )
    result = run_reshard(config, dask_client)
    assert list(result.manifest.splits) == ["train"]
    shards = result.manifest.split("train").shards
    assert sum(s.num_rows for s in shards) == 1_000 and max(s.num_rows for s in shards) <= 300
    location = read_manifest(result.manifest_uri)[1]
    assert sum(pq.read_metadata(shard_uri(location, s)).num_rows for s in shards) == 1_000
