"""A killed reshard resumes on S3 (moto's server on loopback): the rerun claims the dead
attempt with a conditional PUT (preprocessing/versions/claim.py), verifies what it staged
and wrote from one listing per prefix by the ETags its receipts recorded (no read back, no
HEAD per object), and commits the version a clean run makes. Two reruns racing for one
dead attempt, a stalled holder, and a rerun of another version, on S3 too."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import fsspec
import pytest
from distributed import Client

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.manifest import read_manifest
from preprocessing.driver.cluster import local_cluster
from preprocessing.driver.reshard import ReshardResult, run_reshard
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.versions.attempt import HOLDER, LEASE_NAME, STAGING_DIR, VersionAttempt
from preprocessing.versions.claim import CLAIM_PREFIX
from tests.log_records import messages, records_of
from tests.preprocessing.s3_requests import RequestLog, counted_s3
from tests.preprocessing.test_kill import kill_session, start_reshard

pytestmark = pytest.mark.slow  # moto's S3 server, and reshard processes


def digests(result: ReshardResult) -> list[str]:
    return [s.sha256 for split in ("train", "holdout") for s in result.manifest.split(split).shards]


def wait_for_s3(
    fs: fsspec.AbstractFileSystem, pattern: str, process, timeout_s: float = 180
) -> None:
    """Wait until an object matching `pattern` exists (the reshard reached a kill point)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and process.poll() is None:
        fs.invalidate_cache()
        if fs.glob(pattern):
            return
        time.sleep(0.1)
    raise AssertionError(f"the reshard wrote no {pattern} before it ended or timed out")


def store_requests(log: RequestLog, bucket: str, root: str) -> dict[str, int]:
    """What a run asked of its output root: HEADs of a staged object or a receipt (a
    check per object), listings, and HEADs and GETs of a shard (a read back, or a check)."""
    made = log.matching(f"/{bucket}/{root}/")
    return {
        "staged_heads": sum(
            r.method == "HEAD"
            and f"/{STAGING_DIR}/" in r.path
            and r.path.endswith((".arrow", ".done", ".json"))
            for r in made
        ),
        "listings": sum(
            r.method == "GET" and "list-type=2" in r.query and f"prefix={root}%2F" in r.query
            for r in log.requests
        ),
        "shard_requests": sum(
            r.method in ("HEAD", "GET") and "/v-" in r.path and r.path.endswith(".parquet")
            for r in made
        ),
    }


def test_a_reshard_killed_mid_write_on_s3_resumes_from_one_listing_per_prefix(
    tmp_path: Path,
) -> None:
    """Invariants: after SIGKILL of a reshard's process group on S3 with some write tasks'
    receipts written, the rerun claims the dead attempt, keeps its scans and some but not
    all shards and says so (manifest `resumed`, its run log lines, `ReshardResult.resumed`),
    commits the version id of a clean run with byte-identical shards, and leaves no
    staging; it sends no HEAD per staged object or receipt, lists at most 8 prefixes more
    than a clean run, and asks no more of the shards than a clean run (its table's schema
    read): the listings' ETags verify them, nothing is read back."""
    write_sample(tmp_path / "raw", SampleSpec(num_rows=30_000, num_files=4, seed=11))
    bucket = f"resume-{uuid.uuid4().hex[:8]}"
    with counted_s3() as log:
        fs = fsspec.filesystem("s3")
        fs.mkdir(bucket)
        fs.put(f"{tmp_path / 'raw'}/", f"{bucket}/raw/", recursive=True)
        config = ReshardConfig(
            dataset=DatasetSpec(inputs=[f"s3://{bucket}/raw/*.parquet"]),
            output_root=f"s3://{bucket}/out",
            target_shard_rows=500,
            rows_per_row_group=250,
            exchange_task_bytes=1 << 19,
            single_pass_bytes=0,  # the staged route's resume
            exchange_fan_in=4,
            max_tasks_in_flight=2,
            num_workers=2,
        )
        process = start_reshard(config, tmp_path)
        wait_for_s3(fs, f"{bucket}/out/{STAGING_DIR}/*/*/receipts/write-*.json", process)
        kill_session(process)
        assert not fs.glob(f"{bucket}/out/v-*/_MANIFEST.json")
        with local_cluster(2) as cluster, Client(cluster) as client:
            log.clear()
            with records_of("preprocessing") as logged:
                rerun = run_reshard(config, client)
            requests = store_requests(log, bucket, "out")
            clean = run_reshard(
                config.model_copy(update={"output_root": f"s3://{bucket}/clean"}), client
            )
            clean_requests = store_requests(log, bucket, "clean")
        manifest, _ = read_manifest(config.output_root)
        fs.invalidate_cache()
        left = fs.find(f"{bucket}/out/{STAGING_DIR}")
    print(rerun.resumed, requests, "clean run:", clean_requests)
    assert rerun.manifest.version_id == clean.manifest.version_id == manifest.version_id
    assert digests(rerun) == digests(clean)
    resumed = manifest.resumed
    assert 0 < resumed["shards_kept"] < resumed["shards"] == len(digests(clean)), resumed
    assert rerun.resumed in messages(logged) and rerun.resumed.startswith("resumed: ")
    assert "scan kept: the scans of 4 input files" in messages(logged).splitlines()
    assert requests["staged_heads"] == 0, requests
    # What the rerun verified it listed once per prefix: the attempt, its receipts, each
    # round kept, the shards; a handful of listings more than a clean run, not one per object.
    assert requests["listings"] <= clean_requests["listings"] + 8, (requests, clean_requests)
    assert requests["shard_requests"] <= clean_requests["shard_requests"], clean_requests
    assert left == []


@pytest.fixture
def bucket(s3_endpoint: str) -> str:
    name = f"claim-{uuid.uuid4().hex[:8]}"
    fsspec.filesystem("s3").mkdir(name)
    return name


def dead_s3_attempt(root: str, version_id: str, name: str) -> str:
    """An attempt on S3 whose holder (a process of this host that no longer exists) last
    beat 400 s ago, with one staged object; its path."""
    fs = fsspec.filesystem("s3")
    path = f"{root.removeprefix('s3://')}/{STAGING_DIR}/{version_id}/{name}"
    lease = {"holder": HOLDER, "pid": 2**22 + 7, "heartbeat_at": time.time() - 400}
    fs.pipe_file(f"{path}/{LEASE_NAME}", json.dumps(lease).encode())
    fs.pipe_file(f"{path}/train-00000.parquet", b"left by the dead run")
    return path


def test_of_reruns_racing_for_one_dead_attempt_on_s3_exactly_one_claims_it(bucket) -> None:
    """Invariants: four reruns of one version entering together, with one dead attempt
    on S3, end with exactly one staging in it (its lease names that one, one claim object
    exists) and the three others each in a new attempt of their own; all four leave no
    staging."""
    root = f"s3://{bucket}/root"
    dead = dead_s3_attempt(root, "v1", "killed")
    start, hold = threading.Barrier(4), threading.Barrier(4)
    seen: list[tuple[str | None, str]] = []

    def rerun() -> None:
        start.wait()
        with VersionAttempt(root, "v1", resume_max_age_s=3600) as attempt:
            seen.append((attempt.resumed_from, attempt.attempt_id))
            hold.wait()  # all four hold their attempts at once

    threads = [threading.Thread(target=rerun) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [attempt_id for resumed, attempt_id in seen if resumed]
    assert len(seen) == 4 and len(winners) == 1, seen
    fs = fsspec.filesystem("s3")
    fs.invalidate_cache()
    assert fs.find(f"{bucket}/root/{STAGING_DIR}") == []
    assert not fs.exists(dead)


def test_a_stalled_holder_on_s3_leaves_its_attempt_to_the_rerun_that_claimed_it(bucket) -> None:
    """Invariants: a holder whose lease expired while it stalled, once a rerun claimed its
    attempt, sees the rerun's lease at its next heartbeat, stops renewing and, failing,
    neither releases nor removes the staging; the rerun's lease and claim stay, and the
    rerun's own exit removes the staging."""
    root = f"s3://{bucket}/root"
    fs = fsspec.filesystem("s3")
    stalled = VersionAttempt(root, "v1", heartbeat_s=3600, resume_max_age_s=3600).__enter__()
    lease = json.loads(fs.cat_file(f"{stalled.uri}/{LEASE_NAME}"))
    stale = {**lease, "heartbeat_at": time.time() - 400, "pid": 2**22 + 7}  # as seen
    fs.pipe_file(f"{stalled.uri}/{LEASE_NAME}", json.dumps(stale).encode())
    with VersionAttempt(root, "v1", resume_max_age_s=3600) as rerun:
        assert rerun.resumed_from == stalled.uri
        stalled.renew()  # the stalled run's next heartbeat
        assert stalled.taken_over
        stalled.__exit__(RuntimeError, RuntimeError("the stalled run fails later"), None)
        fs.invalidate_cache()
        held = json.loads(fs.cat_file(f"{rerun.uri}/{LEASE_NAME}"))
        assert held["attempt_id"] == rerun.attempt_id and not held["released"]
        assert len(fs.glob(f"{rerun.uri}/{CLAIM_PREFIX}*")) == 1
    fs.invalidate_cache()
    assert fs.find(f"{bucket}/root/{STAGING_DIR}") == []


def test_a_rerun_of_another_version_on_s3_reuses_nothing_and_removes_the_old_staging(
    bucket,
) -> None:
    """Invariants: a dead attempt of version v0 on S3 is not taken over by a run of v1
    (another config, so another version id), and that run removes it."""
    root = f"s3://{bucket}/root"
    dead = dead_s3_attempt(root, "v0", "killed")
    with VersionAttempt(root, "v1", resume_max_age_s=3600) as attempt:
        assert attempt.resumed_from is None
        fs = fsspec.filesystem("s3")
        fs.invalidate_cache()
        assert not fs.exists(f"{dead}/{LEASE_NAME}")
        assert not fs.exists(f"{attempt.uri}/train-00000.parquet")
