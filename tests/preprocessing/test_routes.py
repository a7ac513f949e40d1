"""The two routes of a reshard (preprocessing/plan/route.py) make the same version: the
single pass and the staged exchange give the same version id and byte-identical shards,
whatever the input's size, the budget and the shuffle mode; a killed single pass leaves
no version, and its rerun commits the clean run's bytes and leaves no staging."""

from __future__ import annotations

import tempfile
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import MANIFEST_NAME, Manifest, read_current_version
from preprocessing.driver.reshard import run_reshard
from preprocessing.plan.route import SINGLE_PASS, STAGED
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.versions.attempt import STAGING_DIR
from tests.preprocessing.test_kill import (
    assert_committed,
    kill_session,
    output,
    start_reshard,
    wait_for_staged,
)

pytestmark = pytest.mark.slow  # reshards on the session Dask cluster, a killed one in its own


def digests(manifest: Manifest) -> list[str]:
    return [s.sha256 for split in manifest.splits.values() for s in split.shards]


@settings(
    max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(300, 6_000),
    files=st.integers(1, 5),
    shuffle=st.sampled_from(["stratified", "global", "block", "none"]),
    budget=st.sampled_from([None, 1, 10**12]),
    shard_rows=st.sampled_from([97, 500, 5_000]),
    task_bytes=st.sampled_from([1, 64 << 20]),
    validation=st.sampled_from([0.0, 0.25]),
)
def test_both_routes_make_the_same_version(
    dask_client, rows, files, shuffle, budget, shard_rows, task_bytes, validation
) -> None:
    """Invariants: a run under `budget` (None: the default, an eighth of the host's
    memory; 1: too small for any input) takes the route its rows decide, and gives the
    version id and byte-identical shards (every split, a validation split too) of a staged
    run (budget 0); both with any task size (a single pass's blocks of rows: 1 byte, a
    block per piece); each manifest records its route."""
    with tempfile.TemporaryDirectory() as directory:
        raw = Path(directory) / "raw"
        write_sample(raw, SampleSpec(num_rows=rows, num_files=files, num_features=3, seed=rows))

        def run(name: str, **route: object) -> Manifest:
            config = ReshardConfig(
                dataset=DatasetSpec(inputs=[str(raw)], validation_fraction=validation),
                output_root=str(Path(directory) / name),
                shuffle=shuffle,
                target_shard_rows=shard_rows,
                rows_per_row_group=64,
                max_piece_rows=400,
                **route,
            )
            return run_reshard(config, dask_client).manifest

        staged = run("staged", single_pass_bytes=0, exchange_task_bytes=task_bytes)
        chosen = run("chosen", single_pass_bytes=budget, exchange_task_bytes=task_bytes)
    assert staged.route["route"] == STAGED
    assert chosen.route["route"] == (STAGED if budget == 1 else SINGLE_PASS)
    assert chosen.version_id == staged.version_id
    assert digests(chosen) == digests(staged)
    assert ("validation" in staged.splits) == (validation > 0)


def test_a_killed_single_pass_leaves_no_version_and_its_rerun_commits_the_clean_bytes(
    tmp_path, dask_client
) -> None:
    """Fault: SIGKILL of `python -m preprocessing` and its workers once the single pass
    has written some shards. Invariants: no manifest and no `_CURRENT`; the rerun takes
    the single pass again, commits the version id and byte-identical shards of a clean
    run, and leaves no staging (the dead run's included)."""
    write_sample(tmp_path / "raw", SampleSpec(num_rows=120_000, num_files=6, seed=17))
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]),
        output_root=str(tmp_path / "out"),
        target_shard_rows=200,  # hundreds of shards: the kill lands among their writes
        rows_per_row_group=100,
    )
    process = start_reshard(config, tmp_path)
    wait_for_staged(tmp_path / "out", process, "**/train-*.parquet")
    kill_session(process)
    assert not list((tmp_path / "out").glob(f"v-*/{MANIFEST_NAME}")), output(tmp_path)
    assert read_current_version(str(tmp_path / "out")) is None
    # SIGKILL leaves the dead run's staging to the rerun, with part of the shards.
    written = list((tmp_path / "out" / STAGING_DIR).glob("*/*/**/*-*.parquet"))
    rerun = run_reshard(config, dask_client)
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )
    assert rerun.manifest.route["route"] == SINGLE_PASS == clean.manifest.route["route"]
    assert rerun.manifest.version_id == clean.manifest.version_id
    assert digests(rerun.manifest) == digests(clean.manifest)
    assert 0 < len(written) < len(digests(clean.manifest)), "the kill missed the writes"
    assert_committed(tmp_path / "out", rerun.manifest.version_id)


def test_a_small_standalone_reshard_runs_on_threads_and_makes_the_same_version(
    tiny_raw, tmp_path, dask_client
) -> None:
    """Invariants: `run_reshard` with no executor on an input whose stored bytes fit the
    budget's in-process share (plan/route.py `runs_in_process`) starts no worker process
    (no child beside the session cluster's while its stages run); with a budget too
    small for that, it starts worker processes; both commit the version id and
    byte-identical shards of a run on the session's process cluster."""
    before = len(psutil.Process().children(recursive=True))  # the session cluster's
    children: dict[str, int] = {}

    def run(name: str, budget: int | None, executor: object = None) -> Manifest:
        config = ReshardConfig(
            dataset=DatasetSpec(inputs=[str(tiny_raw)]),
            output_root=str(tmp_path / name),
            target_shard_rows=300,
            single_pass_bytes=budget,
        )

        def count(stage: str, done: int, total: int) -> None:
            found = len(psutil.Process().children(recursive=True))
            children[name] = max(children.get(name, 0), found)

        return run_reshard(config, executor, progress=count).manifest  # type: ignore[arg-type]

    threads, processes = run("threads", None), run("processes", 1)
    reference = run("reference", 1, dask_client)
    assert children["threads"] == before and children["processes"] >= before + 2, children
    assert threads.route["route"] == SINGLE_PASS and processes.route["route"] == STAGED
    assert threads.version_id == processes.version_id == reference.version_id
    assert digests(threads) == digests(processes) == digests(reference)
