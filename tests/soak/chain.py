"""The nightly incremental chain under one fault a night, checked after every night.

Inputs live on moto's S3 under `raw/`, read through the fault proxy (tests/fault_proxy.py);
the output root is a small tmpfs when this host lets us mount one (else a plain
directory, and `disk_full` is left out). Night 0 reshards the base files; each later
night uploads one new file and now and then rewrites an old one (`on_changed_inputs:
rebuild` then makes a flat version), and runs `python -m preprocessing` (its own Dask
cluster) with one fault drawn by a seeded generator, landing after a random delay
within the run's expected duration (the faults: tests/soak/night_faults.py; the soak's
settings and state: tests/soak/soak_state.py):

- `driver_kill`: SIGKILL of the driver's whole session;
- `worker_kill`: SIGKILL of one Dask worker process of the driver;
- `s3_503`: the proxy answers the next 2-5 GETs of every input with 503 SlowDown;
- `disk_full`: the output tmpfs filled to within 0-32 KiB of full (freed after the run).

A run that fails is rerun without faults and must commit ("recovered by rerun"). Then:
`_CURRENT` names a committed version; `verify_chain(deep=True)` (`ballast verify --deep`)
finds the chain whole; the current version's rows, per split and sorted by id, equal
those of a from-scratch reshard of the same inputs into an empty root (natural class
weighting: every input row once); no staging of a dead attempt is left. After the last
night a compaction (`--compact`) of the chain is byte-identical to the from-scratch
reshard. The from-scratch reshards run in this process on the soak's own LocalCluster
(started after moto, so its workers see it), not under faults. `Soak.extra_nights` adds
night kinds run by other modules: the training nights of tests/soak/training_nights.py
(a rank killed, the MLflow or the Prefect server restarted, under the pipeline flow).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import s3fs

from preprocessing.contract.manifest import read_current_version, read_manifest, shard_uri
from preprocessing.contract.verify import verify_chain
from preprocessing.driver.reshard import run_reshard
from preprocessing.synthetic.tabular import sample_table, write_sample
from preprocessing.versions.attempt import STAGING_DIR, lease_expired
from tests.soak.night_faults import inject
from tests.soak.soak_state import BASE, REPO, Night, Soak, Tally, config_file, config_for, s3

NIGHT_ROWS, CHANGE_PROBABILITY, RUN_TIMEOUT_S = 200, 0.15, 300
COLUMNS = ["id", "label", "source", "features"]


def fault_schedule(seed: int, nights: int, kinds: tuple[str, ...]) -> list[str]:
    """One fault per night after night 0, drawn by a seeded generator so that each kind
    comes up as evenly as the count allows (a shuffled deck, dealt again when empty)."""
    rng = np.random.default_rng(seed)
    deck: list[str] = []
    schedule = ["none"]
    while len(schedule) < nights:
        deck = deck or list(rng.permutation(kinds))
        schedule.append(str(deck.pop()))
    return schedule


def upload(soak: Soak, table: pa.Table, name: str) -> None:
    """Put one input file into the bucket directly (around the proxy)."""
    local = soak.work / "uploads" / name
    local.parent.mkdir(exist_ok=True)
    pq.write_table(table, local, row_group_size=100)
    s3(soak).put(str(local), f"{soak.bucket}/raw/{name}")


def add_inputs(soak: Soak, night: int, rng: np.random.Generator) -> str:
    """Night 0: the base files; later: one new file, sometimes one earlier file rewritten."""
    if night == 0:
        write_sample(soak.work / "base", BASE)
        s3(soak).put(f"{soak.work / 'base'}/", f"{soak.bucket}/raw/", recursive=True)
        return "base"
    upload(
        soak,
        sample_table(rng, 100_000 * night, NIGHT_ROWS, night % 2, BASE),
        f"night-{night:03d}.parquet",
    )
    if night > 2 and rng.random() < CHANGE_PROBABILITY:
        changed = int(rng.integers(1, night))
        upload(
            soak,
            sample_table(rng, 100_000 * changed, NIGHT_ROWS - 7, changed % 2, BASE),
            f"night-{changed:03d}.parquet",
        )
        return f"new file, night-{changed:03d} rewritten"
    return "new file"


def start(soak: Soak, config: Path, name: str, endpoint: str, *extra: str) -> subprocess.Popen:
    """`python -m preprocessing` of this checkout in its own session, S3 at `endpoint`, on
    a local cluster of worker processes as a production night's input would get (a
    soak-sized input alone would run on threads in the driver: no worker to kill)."""
    search = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": search, "AWS_ENDPOINT_URL": endpoint}
    logs = soak.work / "logs"
    logs.mkdir(exist_ok=True)
    dask = soak.work / "dask-local.yaml"
    dask.write_text("kind: local\nnum_workers: 2\n")
    command = [sys.executable, "-m", "preprocessing", "--config", str(config), "--dask", str(dask)]
    with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
        return subprocess.Popen(
            [*command, *extra],
            start_new_session=True,
            stdout=out,
            stderr=err,
            env=env,
        )


def finish(process: subprocess.Popen, timeout_s: float = RUN_TIMEOUT_S) -> int:
    """Wait for the run; then SIGKILL what is left of its session (orphaned workers)."""
    try:
        code = process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = -999
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=30)
    return code


def faulted_run(soak: Soak, night: int, kind: str, rng: np.random.Generator) -> tuple[int, bool]:
    """The night's run with its fault after a random delay; (exit status, fault landed)."""
    process = start(
        soak, config_file(soak, soak.root, "night"), f"night-{night:03d}", soak.proxy.url
    )
    landed: list[bool] = []
    delay = float(rng.uniform(0.1, 0.9)) * soak.expected_s
    timer = threading.Timer(delay, lambda: landed.append(inject(soak, kind, process, rng)))
    timer.start()
    began = time.monotonic()
    code = finish(process)
    if code == 0 and not landed:
        soak.expected_s = time.monotonic() - began
    timer.cancel()
    timer.join()
    served = kind == "s3_503" and sum(soak.proxy.served.values()) > 0
    soak.proxy.clear()
    soak.proxy.served.clear()
    with contextlib.suppress(FileNotFoundError):
        (soak.root / ".filler").unlink()
    return code, (bool(landed and landed[0]) and kind != "s3_503") or served


def clean_run(soak: Soak, root: Path, name: str, *extra: str) -> None:
    """A run without faults (straight to moto) that must commit; it times the next fault."""
    began = time.monotonic()
    code = finish(start(soak, config_file(soak, root, name), name, soak.moto_url, *extra))
    soak.expected_s = time.monotonic() - began
    if code != 0:
        err = (soak.work / "logs" / f"{name}.err").read_text()[-3000:]
        raise AssertionError(f"{name}: exit status {code}, expected a commit:\n{err}")


def split_rows(root: Path) -> dict[str, pa.Table]:
    """Every row of each split of the current version, sorted by id."""
    manifest, location = read_manifest(str(root))
    rows = {}
    for name, split in manifest.splits.items():
        tables = [
            pq.read_table(shard_uri(location, entry), columns=COLUMNS) for entry in split.shards
        ]
        rows[name] = pa.concat_tables(tables).sort_by("id") if tables else None
    return rows


def rows_lost(current: dict[str, pa.Table], fresh: dict[str, pa.Table]) -> int:
    """Rows of the from-scratch reshard missing from (or different in) the current version,
    plus rows the current version has that it lacks."""
    lost = 0
    for name in fresh.keys() | current.keys():
        mine, theirs = current.get(name), fresh.get(name)
        if mine is None or theirs is None or not mine.equals(theirs):
            ids = set(mine.column("id").to_pylist()) if mine is not None else set()
            want = set(theirs.column("id").to_pylist()) if theirs is not None else set()
            lost += max(len(want ^ ids), 1)
    return lost


def check_night(soak: Soak, night: int) -> int:
    """The invariants after a night (AssertionError naming the broken one); rows lost."""
    current = read_current_version(str(soak.root))
    assert current is not None, f"night {night}: _CURRENT names no version"
    read_manifest(str(soak.root))  # committed: its manifest reads and validates
    report = verify_chain(str(soak.root), deep=True)
    assert report.whole, f"night {night}: ballast verify --deep:\n{report.text()}"
    fs = fsspec.filesystem("file")
    dead = [
        attempt
        for attempt in fs.glob(f"{soak.root}/{STAGING_DIR}/*/*")
        if lease_expired(fs, attempt)
    ]
    assert not dead, f"night {night}: staging of dead attempts left: {dead}"
    fresh = soak.work / "fresh" / f"night-{night:03d}"
    # This process and the cluster's workers keep s3fs instances whose listing and file
    # info caches predate tonight's uploads: drop them, or the reshard misses new files.
    s3fs.S3FileSystem.clear_instance_cache()
    if soak.client is not None:
        soak.client.run(s3fs.S3FileSystem.clear_instance_cache)
    run_reshard(config_for(soak, fresh), soak.client)  # on the soak's own cluster
    return rows_lost(split_rows(soak.root), split_rows(fresh))


def last_error_line(soak: Soak, name: str) -> str:
    """The last non-empty line the run `name` wrote to its stderr (its one-line cause)."""
    with contextlib.suppress(FileNotFoundError):
        lines = (soak.work / "logs" / f"{name}.err").read_text().strip().splitlines()
        return lines[-1][:300] if lines else "(no stderr)"
    return "(no stderr file)"


def run_night(soak: Soak, night: int, kind: str, rng: np.random.Generator) -> Night:
    if kind in soak.extra_nights:
        return soak.extra_nights[kind](soak, night, kind, rng)  # type: ignore[no-any-return]
    started = time.monotonic()
    how = add_inputs(soak, night, rng)
    if kind == "none":
        clean_run(soak, soak.root, f"night-{night:03d}")
        code, landed = 0, False
    else:
        code, landed = faulted_run(soak, night, kind, rng)
        if code != 0:  # the table counts it; the night's line says what ended the run
            how += f"; exit {code}: {last_error_line(soak, f'night-{night:03d}')}"
            clean_run(soak, soak.root, f"rerun-{night:03d}")
    lost = check_night(soak, night)
    return Night(night, kind, landed, code != 0, how, time.monotonic() - started, lost)


def compaction_matches(soak: Soak) -> bool:
    """A compaction of the chain is byte-identical to the last from-scratch reshard."""
    clean_run(soak, soak.root, "compact", "--compact")
    last = max((soak.work / "fresh").iterdir())
    mine, theirs = read_manifest(str(soak.root))[0], read_manifest(str(last))[0]
    return mine.version_id == theirs.version_id and all(
        [e.sha256 for e in mine.split(s).shards] == [e.sha256 for e in theirs.split(s).shards]
        for s in theirs.splits
    )


def soak_nights(soak: Soak, nights: int) -> dict[str, Tally]:
    """Run `nights` nights; the tally per fault kind (printed as it goes)."""
    rng = np.random.default_rng(soak.seed)
    tallies = {kind: Tally() for kind in soak.kinds}
    for number, kind in enumerate(fault_schedule(soak.seed, nights, soak.kinds)):
        night = run_night(soak, number, kind, rng)
        soak.nights.append(night)
        print(
            f"night {number:3d} {kind:15} landed={night.landed!s:5} rerun={night.rerun!s:5} "
            f"lost={night.lost} {night.seconds:5.1f}s ({night.how})",
            flush=True,
        )
        if kind in tallies:
            tally = tallies[kind]
            tally.hit += 1
            tally.landed += night.landed
            tally.survived += night.landed and not night.rerun
            tally.recovered += night.rerun
            tally.lost += night.lost
    return tallies


def table(tallies: dict[str, Tally]) -> str:
    lines = [
        f"{'fault':15} {'nights hit':>10} {'landed':>7} {'survived in run':>16} "
        f"{'recovered by rerun':>19} {'data lost':>10}"
    ]
    lines += [
        f"{kind:15} {t.hit:10d} {t.landed:7d} {t.survived:16d} {t.recovered:19d} {t.lost:10d}"
        for kind, t in tallies.items()
    ]
    return "\n".join(lines)
