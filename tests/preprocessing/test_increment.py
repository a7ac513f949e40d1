"""Incremental versions on a real Dask LocalCluster: three nightly runs each adding 10% new
files, what they read, the chain's mix and row counts, the loader over the chain,
changed inputs, compaction, and the feature codec of a chain (races and faults of a
child's commit: test_increment_commit.py).

Old input files are overwritten with zeros of the same size and their mtime restored
after each run (tests/preprocessing/nightly.py: `spoil`): the listing is unchanged, so a
run that read any of them would fail.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import (
    Manifest,
    read_current_version,
    read_manifest,
    shard_uri,
    version_dir,
)
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.plan.row_fates import holdout_mask
from preprocessing.synthetic.tabular import write_sample
from preprocessing.versions.attempt import STAGING_DIR
from preprocessing.versions.incremental import InputsChanged
from tests.preprocessing.nightly import SPEC, add_night, config_for, restore, spoil
from training.config import LoaderConfig
from training.data.loader import ShardStream

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster


@dataclass(frozen=True)
class Chain:
    raw: Path
    pristine: Path
    root: Path
    results: list[ReshardResult]  # the base, then one per night
    files: list[list[str]]  # the input file names each run added


@pytest.fixture(scope="module")
def chain(tmp_path_factory, dask_client) -> Chain:
    """A base version of 10 files, then three nightly runs each adding one file (10%)."""
    base = tmp_path_factory.mktemp("nightly")
    raw, pristine, root = base / "raw", base / "pristine", base / "out"
    write_sample(raw, SPEC)
    results = [run_reshard(config_for(raw, root), dask_client)]
    files = [sorted(p.name for p in raw.glob("*.parquet"))]
    for night in range(3):
        spoil(raw, pristine)
        files.append([add_night(raw, night).name])
        results.append(run_reshard(config_for(raw, root), dask_client))
    spoil(raw, pristine)
    restore(raw, pristine)
    return Chain(raw, pristine, root, results, files)


def read_ids(manifest: Manifest, location: str, split: str) -> Counter[int]:
    tables = [
        pq.read_table(shard_uri(location, entry), columns=["id"])
        for entry in manifest.split(split).shards
    ]
    return Counter(pa.concat_tables(tables).column("id").to_pylist())


def test_each_night_reads_only_its_new_file_and_appends_a_child(chain: Chain) -> None:
    """Invariants: every night commits a child of the night before with one delta more;
    it read one file (the new one: the others are zeros) in as many pieces as the file
    has row groups; the parent's shards are listed in the parent's directories, not
    copied; `_CURRENT` names the newest child."""
    base, *nights = chain.results
    assert base.manifest.parent_version is None and len(base.manifest.deltas) == 1
    for index, (previous, result) in enumerate(zip(chain.results, nights, strict=False)):
        manifest = result.manifest
        assert not result.reused and manifest.parent_version == previous.manifest.version_id
        assert [d.version_id for d in manifest.deltas] == [
            r.manifest.version_id for r in chain.results[: index + 2]
        ]
        own = manifest.deltas[-1]
        new_file = chain.pristine / chain.files[index + 1][0]
        assert (own.num_files, own.num_bytes) == (1, new_file.stat().st_size)
        assert own.num_pieces == pq.ParquetFile(new_file).metadata.num_row_groups == 3
        older = manifest.split("train").shards[: len(previous.manifest.split("train").shards)]
        assert all(entry.version is not None for entry in older)
        own_dir = Path(version_dir(str(chain.root), manifest.version_id))
        assert {str(p.relative_to(own_dir)) for p in own_dir.rglob("*.parquet")} == {
            e.path for split in manifest.splits.values() for e in split.shards if e.version is None
        }
    assert read_current_version(str(chain.root)) == nights[-1].manifest.version_id


def test_the_chain_meets_the_uniform_mix(chain: Chain) -> None:
    """Invariants: each delta's classes get equal training rows (+-1); over the chain's
    shards the classes are within one row per delta of each other."""
    manifest = chain.results[-1].manifest
    for delta in manifest.deltas:
        per_class = Counter()
        for label, _, _, output_rows in delta.strata["train"]:
            per_class[label] += output_rows
        assert len(per_class) == SPEC.num_classes
        assert max(per_class.values()) - min(per_class.values()) <= 1
    union = Counter()
    for shard in manifest.split("train").shards:
        union.update(shard.class_counts)
    assert max(union.values()) - min(union.values()) <= len(manifest.deltas)


def test_every_input_row_appears_as_often_as_its_delta_planned(chain: Chain) -> None:
    """Invariants, per delta and stratum: the recorded input rows are the training rows of
    that delta's files; each such row appears in the chain's training shards floor or ceil
    of output/input times, together exactly the planned output; held-out rows appear once,
    in the holdout shards, never in training."""
    manifest, location = read_manifest(chain.results[-1].manifest_uri)
    train, holdout = read_ids(manifest, location, "train"), read_ids(manifest, location, "holdout")
    for names, delta in zip(chain.files, manifest.deltas, strict=True):
        strata: dict[tuple, list[int]] = {}
        for name in names:
            table = pq.read_table(chain.pristine / name, columns=["id", "label", "source"])
            held = holdout_mask(name, 0, table.num_rows, manifest.seed, 0.1)
            for row, (row_id, label, source) in enumerate(
                zip(*(table.column(c).to_pylist() for c in ("id", "label", "source")), strict=True)
            ):
                if held[row]:
                    assert holdout[row_id] == 1 and train[row_id] == 0
                else:
                    strata.setdefault((label, source), []).append(train[row_id])
        planned = {(label, source): (n, k) for label, source, n, k in delta.strata["train"]}
        assert set(planned) == set(strata)
        for stratum, counts in strata.items():
            n, k = planned[stratum]
            assert len(counts) == n and sum(counts) == k
            assert set(counts) <= {k // n, -(-k // n)}


def test_the_loader_streams_the_chain_as_a_function_of_seed_and_epoch(chain: Chain) -> None:
    """Invariants: an epoch over the chain yields every training row once (ids as often as
    the shards hold them) on 1 and 2 ranks, with equal batch counts per rank and the same
    global order; another stream of the same seed repeats it; the next epoch differs."""
    location = chain.results[-1].manifest_uri
    manifest, _ = read_manifest(location)
    config = LoaderConfig(batch_size=16, remainder="pad")

    def epoch(world_size: int, number: int = 0) -> list[int]:
        per_rank = []
        for rank in range(world_size):
            stream = ShardStream(location, "train", config, seed=5)
            stream.set_epoch(number)
            per_rank.append(list(stream.iterate((rank, world_size), (0, 1))))
        assert len({len(batches) for batches in per_rank}) == 1
        return [
            int(i)
            for step in zip(*per_rank, strict=True)
            for batch in step
            for i in batch["id"][batch["weight"] > 0].tolist()
        ]

    one, two = epoch(1), epoch(2)
    assert Counter(one) == read_ids(manifest, location, "train")
    assert one == two == epoch(1)
    assert epoch(1, number=1) != one


def test_compaction_equals_a_full_reshard_byte_for_byte(
    chain: Chain, tmp_path, dask_client
) -> None:
    """Invariants: `mode: full` on the chain's root commits one flat version (no parent,
    one delta, every shard in its own directory) with the id and the shard bytes of a
    full reshard of the same inputs into an empty root."""
    compacted = run_reshard(config_for(chain.raw, chain.root, mode="full"), dask_client)
    fresh = run_reshard(config_for(chain.raw, tmp_path / "fresh", mode="full"), dask_client)
    manifest = compacted.manifest
    assert manifest.parent_version is None and len(manifest.deltas) == 1
    assert manifest.version_id == fresh.manifest.version_id
    for split in ("train", "holdout"):
        entries = manifest.split(split).shards
        assert all(entry.version is None for entry in entries)
        assert [e.sha256 for e in entries] == [e.sha256 for e in fresh.manifest.split(split).shards]
        assert sum(e.num_rows for e in entries) == chain.results[-1].manifest.split(split).num_rows
    assert read_current_version(str(chain.root)) == manifest.version_id


@pytest.mark.parametrize("change", ["rewritten", "removed"])
def test_a_changed_input_is_refused_naming_it(change, base_version, dask_client) -> None:
    """Invariants: with `incremental.on_changed_inputs: refuse` a rewritten or removed input
    (with a new file beside it) fails the run naming the file and the fix; `_CURRENT` is
    unchanged and nothing is staged."""
    raw, root, base = base_version
    add_night(raw, 0)
    victim = raw / "raw-002.parquet"
    if change == "rewritten":
        pq.write_table(pq.read_table(victim).slice(1), victim)
    else:
        victim.unlink()
    with pytest.raises(InputsChanged, match=rf"raw-002\.parquet {change}.*on_changed_inputs"):
        run_reshard(config_for(raw, root), dask_client)
    assert read_current_version(str(root)) == base.manifest.version_id
    assert not (root / STAGING_DIR).exists()


def test_a_changed_input_is_rebuilt_in_full_when_asked(base_version, tmp_path, dask_client) -> None:
    """Invariant: with `incremental.on_changed_inputs: rebuild` a rewritten input makes a
    flat version equal to a full reshard of the inputs as they are now."""
    raw, root, _ = base_version
    victim = raw / "raw-002.parquet"
    pq.write_table(pq.read_table(victim).slice(1), victim)
    rebuilt = run_reshard(
        config_for(raw, root, incremental={"on_changed_inputs": "rebuild"}), dask_client
    )
    fresh = run_reshard(config_for(raw, tmp_path / "fresh", mode="full"), dask_client)
    assert rebuilt.manifest.parent_version is None and rebuilt.how.startswith("rebuild:")
    assert rebuilt.manifest.version_id == fresh.manifest.version_id


def test_other_settings_are_a_change_too(base_version, dask_client) -> None:
    """Invariant: appending under another seed would mix two seeds' rows: it is refused."""
    raw, root, _ = base_version
    add_night(raw, 0)
    with pytest.raises(InputsChanged, match=r"setting 'seed' is 1, was 0"):
        run_reshard(config_for(raw, root, seed=1), dask_client)


@pytest.mark.parametrize(
    "threshold",
    [
        {"incremental": {"max_chain_length": 2}},
        {"incremental": {"max_small_shard_fraction": 0.1}, "target_shard_rows": 700},
    ],
)
def test_a_chain_past_its_threshold_is_compacted(threshold, tmp_path, dask_client) -> None:
    """Invariants: the first night appends (a child); the second would pass the chain
    length, or finds the chain's small shards (a night's 270 rows against 675-row shards)
    over the fraction, and makes one flat version of every input instead."""
    raw, root = tmp_path / "raw", tmp_path / "out"
    write_sample(raw, SPEC)
    base = run_reshard(config_for(raw, root, **threshold), dask_client)
    add_night(raw, 0)
    child = run_reshard(config_for(raw, root, **threshold), dask_client)
    assert child.manifest.parent_version == base.manifest.version_id
    add_night(raw, 1)
    compacted = run_reshard(config_for(raw, root, **threshold), dask_client)
    assert compacted.how.startswith("compaction:"), compacted.how
    assert compacted.manifest.parent_version is None
    assert len(compacted.manifest.inputs) == SPEC.num_files + 2


def test_a_childs_feature_codec_is_the_codec_of_all_its_inputs(tmp_path, dask_client) -> None:
    """Invariants: a night with a new category, nulls filled by the mean and other values
    gives a child whose codec has the full reshard's vocabulary, null count and (to float
    rounding) mean and standard deviation; the child's rows encode through it."""
    raw, rng = tmp_path / "raw", np.random.default_rng(4)
    raw.mkdir()

    def write(name: str, first_id: int, colors: list[str], shift: float) -> None:
        x = rng.normal(shift, 1.0, 200)
        x[::17] = np.nan
        pq.write_table(
            pa.table(
                {
                    "id": np.arange(first_id, first_id + 200),
                    "label": rng.integers(0, 3, 200),
                    "source": ["s"] * 200,
                    "x": x,
                    "color": rng.choice(colors, 200),
                }
            ),
            raw / name,
        )

    for index in range(4):
        write(f"base-{index}.parquet", 1_000 * index, ["red", "green"], 0.0)
    dataset = DatasetSpec(
        inputs=[str(raw)], feature_columns=["x", "color"], nulls={"x": "fill_mean"}
    )
    settings = {"dataset": dataset, "target_shard_rows": 300, "mode": "incremental"}
    run_reshard(ReshardConfig(output_root=str(tmp_path / "out"), **settings), dask_client)
    write("a-night.parquet", 9_000, ["red", "violet"], 3.0)  # sorts first: another fold order
    child = run_reshard(ReshardConfig(output_root=str(tmp_path / "out"), **settings), dask_client)
    full = run_reshard(ReshardConfig(output_root=str(tmp_path / "full"), **settings), dask_client)
    assert child.manifest.parent_version is not None
    ours, theirs = (m.features["columns"] for m in (child.manifest, full.manifest))
    assert [c["vocabulary"] for c in ours] == [c["vocabulary"] for c in theirs]
    assert ours[1]["vocabulary"] == ["green", "red", "violet"]
    assert [c["null_count"] for c in ours] == [c["null_count"] for c in theirs]
    for key in ("shift", "scale", "fill"):
        assert ours[0][key] == pytest.approx(theirs[0][key], rel=1e-12)
    assert ours[0]["shift"] > 0.3  # the night's higher values are in the mean
    stream = ShardStream(
        child.manifest_uri, "train", LoaderConfig(batch_size=64, remainder="pad"), seed=0
    )
    assert (
        sum(int(b["weight"].sum()) for b in stream.iterate((0, 1), (0, 1)))
        == child.manifest.split("train").num_rows
    )
