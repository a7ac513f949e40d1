"""A whole reshard (`python -m preprocessing`, its own Dask cluster) under real faults:
SIGKILL mid-write and after each commit step, and two runs of one config racing.
The same protocol with a tiny writer, and the staging GC, are in test_commit.py."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from distributed import Client, LocalCluster

from flows.cli.status import attempt_lines
from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.commit import COMMIT_STEPS, KILL_AT_ENV
from preprocessing.contract.manifest import (
    MANIFEST_NAME,
    file_sha256,
    read_current_version,
    read_manifest,
    shard_uri,
)
from preprocessing.driver.cluster import local_cluster
from preprocessing.driver.reshard import run_reshard, version_id_for
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.versions.attempt import STAGING_DIR

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # whole reshards, each in its own process with its own cluster


def start_reshard(
    config: ReshardConfig, directory: Path, name: str = "reshard", **env: str
) -> subprocess.Popen:
    """`python -m preprocessing` of this checkout in its own session (so its Dask workers
    can be killed with it); stdout and stderr go to `<name>.out` and `<name>.err`."""
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    search = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    with open(directory / f"{name}.out", "w") as out, open(directory / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "preprocessing", "--config", str(path)],
            start_new_session=True,
            stdout=out,
            stderr=err,
            env={**os.environ, "PYTHONPATH": search, **env},
        )


def output(directory: Path, name: str = "reshard") -> tuple[str, str]:
    return (directory / f"{name}.out").read_text(), (directory / f"{name}.err").read_text()


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL what is left of the process's session (its orphaned Dask workers)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def wait_for_staged(
    root: Path, process: subprocess.Popen, pattern: str, timeout_s: float = 120
) -> int:
    """Wait until the staging holds a file matching `pattern` (under an attempt); how many."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        written = list(root.glob(f"{STAGING_DIR}/*/*/{pattern}"))
        if written:
            return len(written)
        time.sleep(0.02)
    raise AssertionError(f"the reshard staged no {pattern} before it ended or timed out")


def staged_files(root: Path) -> list[Path]:
    return sorted(p for p in (root / STAGING_DIR).rglob("*") if p.is_file())


def assert_committed(root: Path, version_id: str) -> None:
    """`_CURRENT` names the version, every shard of both splits has its recorded sha256,
    the splits add up, and no staging is left."""
    assert read_current_version(str(root)) == version_id
    manifest, location = read_manifest(str(root))
    assert manifest.version_id == version_id
    for split in manifest.splits.values():
        assert sum(entry.num_rows for entry in split.shards) == split.num_rows
        assert all(file_sha256(shard_uri(location, e)) == e.sha256 for e in split.shards)
    assert staged_files(root) == [] and not (root / STAGING_DIR).exists()


# Kill points: once a map task's staged object has its receipt (the exchange has tasks
# left: 12 map tasks of about 1 MiB, two merge rounds), and once a write task's shards
# have theirs.
KILL_POINTS = {"exchange": "exchange-*/round-0/*.done", "write": "receipts/write-*.json"}


@pytest.mark.parametrize("stage", sorted(KILL_POINTS))
def test_killed_reshard_leaves_no_version_and_rerun_commits_the_same_one(
    tmp_path, dask_client, stage
) -> None:
    """Invariants: after SIGKILL of the whole process group mid-exchange or mid-write, no
    manifest and no `_CURRENT` exist; the rerun commits the version id a clean run makes,
    with byte-identical shards (no row lost or duplicated), having kept what the dead run
    finished (at least one map output, or shard), says so in its manifest, and removes the
    dead run's staging."""
    write_sample(tmp_path / "raw", SampleSpec(num_rows=120_000, num_files=8, seed=11))
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tmp_path / "raw")]),
        output_root=str(tmp_path / "out"),
        target_shard_rows=1_000,
        rows_per_row_group=500,
        exchange_task_bytes=1 << 20,
        single_pass_bytes=0,  # the staged route's resume
        exchange_fan_in=4,  # merge rounds: a rerun works back through them
    )
    process = start_reshard(config, tmp_path)
    wait_for_staged(tmp_path / "out", process, KILL_POINTS[stage])
    kill_session(process)
    assert not list((tmp_path / "out").glob(f"v-*/{MANIFEST_NAME}"))
    assert read_current_version(str(tmp_path / "out")) is None
    shard_receipts = list((tmp_path / "out").glob(f"{STAGING_DIR}/*/*/receipts/*.json"))
    (status,) = attempt_lines(str(tmp_path / "out"), "RESUME")[1:]
    print(status)
    assert "(dead, last heartbeat" in status and status.endswith("written; resume: RESUME")
    rerun = run_reshard(config, dask_client)
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )
    assert rerun.manifest.version_id == clean.manifest.version_id
    digests = lambda r: [  # noqa: E731
        s.sha256 for split in ("train", "holdout") for s in r.manifest.split(split).shards
    ]
    assert digests(rerun) == digests(clean)
    resumed = rerun.manifest.resumed
    print(rerun.resumed, f"(killed in the {stage} stage)")
    assert clean.manifest.resumed == {} and resumed["shards"] == len(digests(clean))
    kept = resumed["shards_kept"] if shard_receipts else resumed["map_outputs_kept"]
    assert kept > 0 and resumed["shards_kept"] < resumed["shards"], resumed
    assert_committed(tmp_path / "out", rerun.manifest.version_id)


@pytest.fixture(scope="module")
def small_raw(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("raw")
    write_sample(directory, SampleSpec(num_rows=20_000, num_files=4, seed=5))
    return directory


def small_config(raw: Path, root: Path, **overrides: object) -> ReshardConfig:
    return ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)]),
        output_root=str(root),
        target_shard_rows=2_000,
        rows_per_row_group=500,
        num_workers=1,
        **overrides,
    )


@pytest.mark.parametrize("step", COMMIT_STEPS)
def test_reshard_killed_after_each_commit_step_is_finished_by_the_rerun(
    small_raw, tmp_path, dask_client, step
) -> None:
    """Fault: `python -m preprocessing` SIGKILLs itself right after `step` of the commit
    (BALLAST_KILL_AT), with an older version current. Invariants: until the rerun,
    `_CURRENT` names the old version or (after the swap) the complete new one; the rerun
    commits the new version (reused once its manifest exists), `_CURRENT` names it, every
    shard checks out, and no staging is left."""
    root = tmp_path / "out"
    old = run_reshard(small_config(small_raw, root, seed=1), dask_client).manifest.version_id
    config = small_config(small_raw, root)
    process = start_reshard(config, tmp_path, **{KILL_AT_ENV: step})
    assert process.wait(timeout=300) == -signal.SIGKILL, output(tmp_path)[1]
    kill_session(process)
    new = version_id_for(config)
    assert (root / f"v-{new}" / MANIFEST_NAME).exists() == (step != "shards")
    assert read_current_version(str(root)) == (new if step == "swap" else old)
    assert staged_files(root), "the killed run left its staging"
    rerun = run_reshard(config, dask_client)
    assert rerun.manifest.version_id == new and rerun.reused == (step != "shards")
    assert_committed(root, new)


def test_two_reshards_of_one_config_race_and_both_exit_zero(small_raw, tmp_path) -> None:
    """Fault: two `python -m preprocessing` runs of one config started together (seen to
    stage at the same time). Invariants: both exit 0 naming the same manifest, one
    `committed` and one `already committed`; `_CURRENT` names the version; every shard
    checks out; no staging is left."""
    root = tmp_path / "out"
    # Staged, on worker processes: a small input's single pass on threads ends in about a
    # second, before a second process started beside it stages at all.
    config = small_config(small_raw, root, single_pass_bytes=0)
    version_id = version_id_for(config)
    runs = [start_reshard(config, tmp_path, name=f"run{k}") for k in range(2)]
    most_attempts, deadline = 0, time.monotonic() + 300
    while any(run.poll() is None for run in runs) and time.monotonic() < deadline:
        most_attempts = max(most_attempts, len(list((root / STAGING_DIR / version_id).glob("*"))))
        time.sleep(0.05)
    codes = [run.wait(timeout=30) for run in runs]
    outputs = [output(tmp_path, f"run{k}") for k in range(2)]
    assert codes == [0, 0], [err for _, err in outputs]
    states = sorted(out.strip().split(": ", 1)[0] for out, _ in outputs)
    assert states == ["already committed", "committed"]
    assert len({out.strip().split(": ", 1)[1] for out, _ in outputs}) == 1
    assert most_attempts == 2, "the two runs did not overlap"
    assert_committed(root, version_id)


def test_a_dask_worker_killed_mid_exchange_changes_nothing(tiny_raw, tmp_path, dask_client) -> None:
    """Invariant: SIGKILL of one of two workers while exchange tasks are in flight (its
    nanny restarts it, Dask reruns its tasks) still commits the version a clean run makes,
    with byte-identical shards: a rerun task rewrites the same staged object."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]),
        output_root=str(tmp_path / "killed"),
        target_shard_rows=300,
        max_piece_rows=60,
        exchange_task_bytes=1,
        single_pass_bytes=0,  # the staged route's resume
        exchange_fan_in=2,
        max_tasks_in_flight=4,
    )
    killed: list[tuple[int, int]] = []
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        victim = min(client.run(os.getpid).values())

        def kill_one(stage: str, done: int, total: int) -> None:
            if stage == "exchange" and done >= total // 3 and not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append((done, total))

        result = run_reshard(config, client, progress=kill_one)
        assert victim not in client.run(os.getpid).values()
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )
    assert killed and killed[0][0] < killed[0][1]  # killed with exchange tasks left

    def digests(r):
        return [s.sha256 for split in ("train", "holdout") for s in r.manifest.split(split).shards]

    assert result.manifest.version_id == clean.manifest.version_id
    assert digests(result) == digests(clean)


def holders(client: Client, prefix: str) -> set[str]:
    """The workers holding a key whose name starts with `prefix` (what a stage's tasks
    share: preprocessing/driver/waves.py `share`, or a scatter's `<Type>-<uuid>` key)."""
    return {
        worker
        for key, workers in client.who_has().items()
        if str(key).startswith(prefix)
        for worker in workers
    }


def kill_sole_holder(client: Client, prefix: str, pids: dict[str, int]) -> str | None:
    """SIGKILL the worker holding the `prefix` value, once it lives on one worker only
    (Dask's active memory manager drops replicas no waiting task needs, within ~2 s of
    the driver pausing here), else the first holder after 10 s; the worker killed, None
    when no worker holds it (yet or any more)."""
    deadline = time.monotonic() + 10
    found = holders(client, prefix)
    while len(found) > 1 and time.monotonic() < deadline:
        time.sleep(0.1)
        found = holders(client, prefix)
    if not found:
        return None
    victim = sorted(found)[0]
    os.kill(pids[victim], signal.SIGKILL)
    return victim


@pytest.mark.parametrize(
    ("stage", "prefix"), [("exchange", "Destinations-"), ("write", "Staging-")]
)
def test_the_worker_holding_what_tasks_share_killed_mid_stage_changes_nothing(
    tiny_raw, tmp_path, dask_client, stage, prefix
) -> None:
    """Invariant: SIGKILL of the one worker holding what every task of the stage shares
    (the exchange's destinations, the write stage's staging), with the stage's tasks left,
    and the same `run_reshard` call commits (no FutureCancelledError, no rerun) the version
    a clean run makes, with byte-identical shards."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(tiny_raw)]),
        output_root=str(tmp_path / "killed"),
        target_shard_rows=100,
        max_piece_rows=60,
        exchange_task_bytes=1,
        single_pass_bytes=0,  # the staged route's resume
        exchange_fan_in=2,
        max_tasks_in_flight=2,
    )
    killed: list[tuple[str, int, int]] = []
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        pids = client.run(os.getpid)

        def kill_one(at: str, done: int, total: int) -> None:
            if at == stage and done < total and not killed:
                victim = kill_sole_holder(client, prefix, pids)
                killed.extend([(victim, done, total)] if victim else [])

        result = run_reshard(config, client, progress=kill_one)
        assert killed and pids[killed[0][0]] not in client.run(os.getpid).values()
    clean = run_reshard(
        config.model_copy(update={"output_root": str(tmp_path / "clean")}), dask_client
    )

    def digests(r):
        return [s.sha256 for split in ("train", "holdout") for s in r.manifest.split(split).shards]

    assert result.manifest.version_id == clean.manifest.version_id
    assert digests(result) == digests(clean)


def test_a_worker_killed_while_the_local_cluster_starts_does_not_fail_the_start() -> None:
    """Invariant: a worker process SIGKILLed right after its nanny spawns it (before the
    cluster is up: "Nanny failed to start", one soak night's worker kill) does not fail
    `local_cluster`: the start is tried again and the cluster has both its workers."""
    this = psutil.Process()
    before = {child.pid for child in this.children(recursive=True)}
    killed: list[int] = []
    done = threading.Event()

    def kill_first_worker() -> None:
        while not done.is_set() and not killed:
            for child in this.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if child.pid not in before and "spawn_main" in " ".join(child.cmdline()):
                        child.kill()
                        killed.append(child.pid)
                        return
            time.sleep(0.005)

    killer = threading.Thread(target=kill_first_worker)
    killer.start()
    try:
        with local_cluster(2) as cluster, Client(cluster) as client:
            pids = client.run(os.getpid)
    finally:
        done.set()
        killer.join()
    assert killed and killed[0] not in pids.values()
    assert len(pids) == 2
