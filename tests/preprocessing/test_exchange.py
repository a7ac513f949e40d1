"""The exchange's shape changes how a version is made, never what it holds: the same
version id and byte-identical shards whatever the rounds, fan-in, task size, tasks in
flight and worker count; and its S3 requests stay under a formula in pieces and shards."""

from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import fsspec
import pytest
from distributed import Client, LocalCluster
from hypothesis import given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import Manifest
from preprocessing.driver import stages
from preprocessing.driver.reshard import run_reshard
from preprocessing.exchange.tasks import release_encode_buffers, thread_encode_buffer
from preprocessing.storage.sources import read_footer
from preprocessing.versions.attempt import VersionAttempt
from tests.preprocessing.s3_requests import counted_s3

pytestmark = pytest.mark.slow  # every test here uses the session Dask cluster

SHAPE = {"target_shard_rows": 300, "rows_per_row_group": 128, "max_piece_rows": 120}
STAGED = {"single_pass_bytes": 0}  # the exchange's shape is the staged route's


def config_for(inputs: Path, output: str, **exchange: object) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[str(inputs)]),
        output_root=output,
        **SHAPE,
        **{**STAGED, **exchange},
    )


def digests(manifest: Manifest) -> list[str]:
    return [
        shard.sha256 for split in ("train", "holdout") for shard in manifest.split(split).shards
    ]


@pytest.fixture(scope="module")
def reference(tiny_raw: Path, tmp_path_factory, dask_client: Client) -> Manifest:
    """The version made with the default exchange (one round on this data)."""
    output = tmp_path_factory.mktemp("reference")
    return run_reshard(config_for(tiny_raw, str(output)), dask_client).manifest


@settings(max_examples=6, deadline=None)
@given(
    fan_in=st.integers(2, 4),
    rounds=st.one_of(st.none(), st.integers(1, 3)),
    task_bytes=st.sampled_from([1, 3_000, 128 << 20]),
    in_flight=st.integers(1, 6),
)
def test_exchange_shape_changes_neither_version_nor_bytes(
    tiny_raw, reference, dask_client, fan_in, rounds, task_bytes, in_flight
) -> None:
    """Invariant: any fan-in, rounds, task size and tasks in flight give the reference's
    version id and byte-identical shards (train and holdout)."""
    with tempfile.TemporaryDirectory() as output:
        made = run_reshard(
            config_for(
                tiny_raw,
                output,
                exchange_fan_in=fan_in,
                exchange_rounds=rounds,
                exchange_task_bytes=task_bytes,
                max_tasks_in_flight=in_flight,
            ),
            dask_client,
        ).manifest
    assert made.version_id == reference.version_id
    assert digests(made) == digests(reference)


def test_three_workers_and_merge_rounds_give_the_same_bytes(tiny_raw, tmp_path, reference) -> None:
    """Invariant: on a cluster of another shape (3 workers), with one piece per map task
    and fan-in 2 (so several merge rounds), the shards are those of the reference."""
    config = config_for(tiny_raw, str(tmp_path / "out"), exchange_task_bytes=1, exchange_fan_in=2)
    with (
        LocalCluster(
            n_workers=3, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        made = run_reshard(config, client).manifest
    assert digests(made) == digests(reference)


def test_each_round_is_discarded_once_the_next_has_read_it(
    tiny_raw, tmp_path, dask_client, reference, monkeypatch
) -> None:
    """Invariants: with merge rounds, a round's staged objects are discarded as soon as
    the next round has run (before the writes start), the last round once every shard is
    written; nothing of the staging is left; the shards are the reference's."""
    events: list[str] = []
    discard, reduce = VersionAttempt.discard, stages.write_stage

    def logged_discard(self: VersionAttempt, uri: str) -> None:
        events.append(uri.rsplit("/", 1)[-1])
        discard(self, uri)

    def logged_reduce(*args: object, **kwargs: object) -> object:
        events.append("writes")
        return reduce(*args, **kwargs)

    monkeypatch.setattr(VersionAttempt, "discard", logged_discard)
    monkeypatch.setattr(stages, "write_stage", logged_reduce)
    config = config_for(
        tiny_raw, str(tmp_path / "out"), exchange_task_bytes=1, exchange_fan_in=2, exchange_rounds=3
    )
    made = run_reshard(config, dask_client).manifest
    assert events == ["round-0", "round-1", "writes", "round-2"]
    assert not any((tmp_path / "out" / "_staging").rglob("*.arrow"))
    assert digests(made) == digests(reference)


def count_pieces(inputs: Path, max_piece_rows: int) -> int:
    footers = [read_footer(str(path), max_piece_rows) for path in sorted(inputs.glob("*.parquet"))]
    return sum(len(footer.piece_starts) for footer in footers if footer is not None)


@pytest.mark.slow
def test_s3_requests_stay_under_a_formula_in_pieces_and_shards(tiny_raw, s3_endpoint) -> None:
    """Invariant: with P pieces, S shards, fan-in F and R read rounds, a whole reshard
    from S3 to S3 (listing, scan, maps, merges, writes, commit, clean-up) makes at most
    2 (P + S) F R + 64 requests, and every staging request moves a whole range: at most
    two PUTs per staged object (it, then its empty receipt, which a rerun lists to resume:
    exchange/receipts.py) and one per write task (its receipt), two GETs (index, range) per
    object a task reads."""
    fan_in, max_piece_rows = 3, 150
    with counted_s3() as log:
        fs = fsspec.filesystem("s3")
        fs.mkdir("counted")
        fs.put(f"{tiny_raw}/", "counted/raw/", recursive=True)
        log.clear()
        config = ReshardConfig(
            dataset=DatasetSpec(inputs=["s3://counted/raw/*.parquet"]),
            output_root="s3://counted/out",
            target_shard_rows=130,
            rows_per_row_group=128,
            max_piece_rows=max_piece_rows,
            exchange_task_bytes=1,
            exchange_fan_in=fan_in,
            num_workers=2,
        )
        manifest = run_reshard(config).manifest
    pieces = count_pieces(tiny_raw, max_piece_rows)
    shards = sum(len(split.shards) for split in manifest.splits.values())
    rounds = 1
    while -(-pieces // fan_in ** (rounds - 1)) > fan_in:  # one piece per map task
        rounds += 1
    staging = log.matching("/_staging/")
    puts = [r for r in staging if r.method == "PUT"]
    gets = [r for r in staging if r.method == "GET"]
    print(
        f"P={pieces} S={shards} F={fan_in} R={rounds}: {len(log.requests)} requests, "
        f"staging {len(puts)} PUT {len(gets)} GET"
    )
    assert rounds >= 3 and pieces >= 20 and shards >= 20
    assert len(puts) <= 2 * (pieces * rounds + shards)
    assert len(gets) <= 2 * fan_in * (pieces + shards) * rounds
    assert len(log.requests) <= 2 * (pieces + shards) * fan_in * rounds + 64


def test_a_thread_keeps_its_encode_buffer_until_the_stage_lets_it_go() -> None:
    """Invariant: a thread's write tasks share one encode buffer (a large shard's buffer
    is not made anew for each task), another thread has its own, and
    `release_encode_buffers` lets every one go: the next task starts a new one."""
    release_encode_buffers()
    first = thread_encode_buffer()
    assert thread_encode_buffer() is first
    other: list[object] = []
    worker = threading.Thread(target=lambda: other.append(thread_encode_buffer()))
    worker.start()
    worker.join()
    assert other[0] is not first
    assert release_encode_buffers() == 2
    assert thread_encode_buffer() is not first
    assert release_encode_buffers() == 1
