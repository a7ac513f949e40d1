"""Kill benchmark: what the rerun of a reshard SIGKILLed mid-stage costs, against a clean run.

Method: scale_bench.py's `sizes` input (`--gb` GB, made once in `--work-dir`) resharded as
there (stratified, `--shards` shards, a LocalCluster of 2 worker processes) on the staged
route (`single_pass_bytes: 0`: a single pass stages nothing a rerun could keep), each run a
child process, after a warm-up. The clean run (fastest of `--clean-runs`) gives the wall
time (spawn to exit) and the shards' sha256, read back here. At each kill point (`--points`
STAGE:FRACTION, default exchange:0.5 write:0.5 write:0.9) a run in a session of its own,
printing run_reshard's `progress(stage, done, total)` lines, is SIGKILLed, driver and
workers, at the stage's first line with done >= ceil(fraction x total) (not its last
task); a fresh child reruns it (same config and output root, so same version id: it takes
the dead attempt over), timed as the clean run; its shards and version id must match.
Work lost, two readings: stage (the issue's: 0.1 after 90% of the writes) = the share of
the killed stage's outputs the rerun did not keep, from its "resumed:" counts (shards, or
map outputs after an exchange kill; tasks beside the triggering one may finish before the
signal lands), later stages not counted; time = 1 - t / T, T the clean run's wall time, t
when the clean run printed the line the kill came at (the share of its time still ahead).
Target (the issue's): rerun wall <= (0.15 + work lost) x clean wall on the stage reading
(the time reading's verdict too), shards byte-identical. Each rerun's seconds are split:
start-up (spawn to run_reshard), cluster start, scan, verifying what the dead attempt left
(`plan_rerun`; of which its shards), exchange and write tasks, the rest (listing, plan,
cluster stop, commit). RSS: the child's process tree, summed, every 50 ms. `--s3`: the same
on moto's server in this process, input, staging and shards in a bucket (moto's files of
objects over 5 MB in `--work-dir`). Disk: 3.2x the input (outputs go once hashed); S3 4.2x.
`--drop-caches` (root) empties the page cache before each run: otherwise the clean run
reads inputs generation left cached, and the rerun the ones later runs evicted.

    .venv/bin/python benchmarks/kill_bench.py --gb 8 --work-dir /tmp/ballast-bench  # --s3: 2 GB

A single pass (`--points pass:FRACTION`, the route of an input that fits
`single_pass_bytes`: the budget is left at its default then, and the run must take it)
stages nothing, so its rerun reads every input again: it is killed FRACTION of the way
from the end of its own scan to the clean run's end (its one task reports no progress
before it ends), and the target is the issue's: rerun <= 1.05x a clean run, no work kept,
byte-identical, and no partial version or staging left (the rerun commits the clean id).

Measured, rerun/clean after exchange 50% / write 50% / write 90% (targets 0.65x / 0.65x /
0.23x, stage reading): 8 GB 1.24x / 0.68x / 0.26x under load (M41); from a cold cache 0.75x
/ 0.46x / 0.52x, then 0.78x / 0.39x / 0.26x with receipts per destination (M47); identical.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # as scale_bench.py

import argparse
import contextlib
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from fsspec.core import url_to_fs

from benchmarks.kill_report import KEPT, Event, breakdown, row, table, verdicts
from benchmarks.reshard_bench import GB, MemoryPeaks, ballast_config, base_job, prepare, warm_up
from benchmarks.scale_bench import DISK_PER_INPUT_BYTE
from preprocessing.contract.manifest import shard_path

TAG = "KILL-BENCH-PROGRESS"
DROP_CACHES = "/proc/sys/vm/drop_caches"
BUCKET = "kill-bench"


PASS = "pass"  # a kill point inside a single pass (the module's docstring)


@dataclass(frozen=True)
class Point:
    """Where a run is killed: once `fraction` of `stage`'s tasks are done; in a single
    pass (`PASS`), `after_scan_s` after its scan's last task (set from the clean run)."""

    stage: str
    fraction: float
    after_scan_s: float = 0.0

    @property
    def name(self) -> str:
        return f"{self.stage} {self.fraction:.0%}"

    def reached(self, stage: str, done: int, total: int) -> bool:
        """At least the fraction done, the stage's last task not yet (a later point)."""
        last = min(math.ceil(self.fraction * total), total - 1)
        return stage == self.stage and total >= 2 and done >= last


def parse_point(text: str) -> Point:
    stage, _, fraction = text.partition(":")
    if stage not in (*KEPT, PASS) or not 0 < float(fraction or 0) < 1:
        raise argparse.ArgumentTypeError(
            f"{text}: STAGE:FRACTION, exchange, write or {PASS}, 0 to 1"
        )
    return Point(stage, float(fraction))


def child(job_path: str) -> None:
    """One reshard of the job, its progress as flushed lines, its result beside the job."""
    from preprocessing.contract.manifest import shard_uri
    from preprocessing.driver import cluster, resume, stages
    from preprocessing.driver.reshard import run_reshard

    job = json.loads(Path(job_path).read_text())
    config = ballast_config("stratified", job)
    # The staged route whatever the input's size, unless a single pass is what is killed.
    route = {} if job["single_pass"] else {"single_pass_bytes": 0}
    config = config.model_copy(update={"exchange_task_bytes": job["task_bytes"], **route})
    spent = {"verify_s": timed(stages, "plan_rerun"), "cluster_s": timed(cluster, "build_cluster")}
    spent["shards_s"] = timed(resume, "_verified_shards")  # of verify_s: the shards' sha256
    start = time.perf_counter()
    result = run_reshard(config, progress=lambda *event: print(TAG, *event, flush=True))
    manifest = result.manifest
    entries = [entry for split in manifest.splits.values() for entry in split.shards]
    found = {
        "reshard_s": time.perf_counter() - start,
        "version_id": manifest.version_id,
        "route": manifest.route["route"],
        "kept": manifest.resumed,
        "resumed": result.resumed,
        "timings_s": {**manifest.timings_s, **{k: sum(v) for k, v in spent.items()}},
        "shards": [shard_uri(result.manifest_uri, entry) for entry in entries],
    }
    Path(job["result"]).write_text(json.dumps(found))


def timed(module: Any, name: str) -> list[float]:
    """Wrap `module.name` to record the seconds of each call into the list returned."""
    spent: list[float] = []
    function = getattr(module, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        result = function(*args, **kwargs)
        spent.append(time.perf_counter() - start)
        return result

    setattr(module, name, wrapper)
    return spent


@dataclass
class Run:
    """A child's wall time (spawn to exit), result (None if killed or failed), progress
    lines as they arrived, memory, the line it was killed at, its shards' sha256."""

    wall_s: float = 0.0
    result: dict[str, Any] | None = None
    events: list[Event] = field(default_factory=list)
    peaks: MemoryPeaks = field(default_factory=MemoryPeaks)
    killed_at: Event | None = None
    error: str = ""
    digests: list[tuple[str, str]] = field(default_factory=list)


def run_child(job: dict[str, Any], scratch: Path, kill: Point | None = None) -> Run:
    """The job run in a child of its own session, SIGKILLed at `kill`."""
    job_path, result = scratch / "job.json", scratch / "result.json"
    job_path.write_text(json.dumps({**job, "result": str(result)}))
    result.unlink(missing_ok=True)
    if job.get("drop_caches"):
        drop_page_cache()
    start = time.perf_counter()
    with open(scratch / "child.err", "w") as err:
        process = subprocess.Popen(
            [sys.executable, __file__, "--child", str(job_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            start_new_session=True,  # its Dask workers are in its session: killed with it
        )
    run = watch(process, start, kill)
    if run.killed_at is None and process.returncode == 0:
        run.result = json.loads(result.read_text())
    elif run.killed_at is None or process.returncode != -signal.SIGKILL:  # or ended first
        run.error = f"exit {process.returncode}: {(scratch / 'child.err').read_text()[-2000:]}"
    return run


def drop_page_cache() -> None:
    """Write back and drop Linux's page cache (root), so that a run reads from disk what
    it reads: otherwise the clean run finds the inputs that generation left cached, and a
    rerun reads the half of them that the runs since have evicted (M47)."""
    os.sync()
    Path(DROP_CACHES).write_text("1\n")


def watch(process: subprocess.Popen[str], start: float, kill: Point | None) -> Run:
    """The child's progress lines and memory till it exits; SIGKILLed at `kill`."""
    import psutil

    run, root = Run(), psutil.Process(process.pid)
    reader = threading.Thread(target=read_progress, args=(process, start, kill, run))
    reader.start()
    while process.poll() is None:
        run.peaks.sample(root)
        time.sleep(0.05)
    run.wall_s = time.perf_counter() - start
    reader.join()
    return run


def read_progress(process: subprocess.Popen[str], start: float, kill: Any, run: Run) -> None:
    """Each progress line as it arrives, timed on this clock since the spawn; the child's
    session SIGKILLed here at once when the line reaches `kill` (no poll in between)."""
    for line in process.stdout or ():
        if line.startswith(TAG):
            _, stage, done, total = line.split()
            run.events.append((stage, int(done), int(total), time.perf_counter() - start))
            if kill and kill.stage == PASS and run.events[-1][:2] == ("scan", int(total)):
                timer = threading.Timer(kill.after_scan_s, kill_pass, (process, start, run))
                timer.daemon = True
                timer.start()
            elif kill and run.killed_at is None and kill.reached(*run.events[-1][:3]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                run.killed_at = run.events[-1]


def kill_pass(process: subprocess.Popen[str], start: float, run: Run) -> None:
    """SIGKILL the child's session in its single pass, unless it has ended already."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        run.killed_at = (PASS, 0, 1, time.perf_counter() - start)


def sha256_of(uri: str) -> str:
    fs, path = url_to_fs(uri)
    with fs.open(path, "rb", block_size=1 << 22) as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def remove(root: str) -> None:
    fs, path = url_to_fs(root)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path, recursive=True)
    fs.invalidate_cache()


def measured(job: dict[str, Any], scratch: Path) -> Run:
    """A clean run or a rerun into job["output"], its shards hashed, its output removed."""
    run = run_child(job, scratch)
    if run.result is not None:  # (name, sha256) of each shard, read back here
        run.digests = [(shard_path(uri), sha256_of(uri)) for uri in run.result["shards"]]
    remove(job["output"])
    return run


def kill_and_rerun(point: Point, job: dict[str, Any], scratch: Path, clean: Run) -> dict:
    """Kill a run at `point` and rerun it: the point's row (its error, if it did not run)."""
    job = {**job, "output": f"{job['output']}-{point.stage}-{point.fraction:g}"}
    if point.stage == PASS:
        scanned = max(event[3] for event in clean.events if event[0] == "scan")
        point = replace(point, after_scan_s=point.fraction * (clean.wall_s - scanned))
    remove(job["output"])
    killed = run_child(job, scratch, kill=point)
    if killed.killed_at is None or killed.error:
        remove(job["output"])
        return {"point": point.name, "error": killed.error or "it ended before the kill point"}
    rerun = measured(job, scratch)
    if rerun.result is None:
        return {"point": point.name, "error": f"the rerun failed: {rerun.error}"}
    return row(point, killed.killed_at, rerun, clean)


def bench(args: argparse.Namespace, source: str, output: str, num_rows: int) -> None:
    """The clean run(s), then each kill point's killed run and rerun; the table."""
    scratch = Path(tempfile.mkdtemp(dir=args.work_dir))
    job = {
        **base_job(num_rows, -(-num_rows // args.shards), args),
        **{"input": source, "output": f"{output}/clean", "task_bytes": args.task_mb << 20},
        "drop_caches": args.drop_caches,
        "single_pass": any(point.stage == PASS for point in args.points),
    }
    remove(job["output"])
    runs = [measured(job, scratch) for _ in range(args.clean_runs)]
    for failed in (run for run in runs if run.result is None):
        raise SystemExit(f"kill_bench: a clean run failed: {failed.error}")
    routes = {run.result["route"] for run in runs if run.result}
    if job["single_pass"] and routes != {"single_pass"}:
        raise SystemExit(f"kill_bench: a {PASS} point needs a single pass; the input took {routes}")
    clean = min(runs, key=lambda run: run.wall_s)
    print(
        f"clean run: {[round(run.wall_s, 1) for run in runs]} s (the fastest kept), RSS "
        f"{clean.peaks.total / GB:.2f} GB; seconds: {breakdown(clean)}",
        flush=True,
    )
    job["output"] = f"{output}/killed"
    rows = []
    for point in args.points:
        rows.append(kill_and_rerun(point, job, scratch, clean))
        print(f"    {point.name}: {rows[-1].get('resumed', 'FAILED')}", flush=True)
    print(table(rows))
    verdicts(rows)
    shutil.rmtree(scratch, ignore_errors=True)


def check_disk(args: argparse.Namespace) -> None:
    made = Path(args.work_dir, f"raw-{args.gb:g}gb-seed{args.seed}", "_GENERATED.json").exists()
    needed = (DISK_PER_INPUT_BYTE + (1 if args.s3 else 0) - (1 if made else 0)) * args.gb
    free = shutil.disk_usage(args.work_dir).free / GB
    print(f"disk: about {needed:.1f} GB needed, {free:.1f} GB free in {args.work_dir}", flush=True)
    if free < needed:
        raise SystemExit("kill_bench: not enough free disk in --work-dir")


@contextlib.contextmanager
def store(args: argparse.Namespace, raw: Path) -> Iterator[tuple[str, str]]:
    """(input, output root): local paths, or on moto's server in this process (quiet: its
    requests are logged, not printed) with the input uploaded."""
    if not args.s3:
        yield str(raw), str(Path(args.work_dir) / "kill-out")
        return
    import fsspec

    from tests.preprocessing.s3_requests import counted_s3

    with tempfile.TemporaryDirectory(dir=args.work_dir) as spill, counted_s3():
        tempfile.tempdir = spill  # moto's files of large objects
        fs = fsspec.filesystem("s3")
        fs.mkdir(BUCKET)
        fs.put(f"{raw}/", f"{BUCKET}/raw/", recursive=True)
        yield f"s3://{BUCKET}/raw/*.parquet", f"s3://{BUCKET}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--gb", type=float, help="input size, GB (default 8, 2 with --s3)")
    add("--s3", action="store_true", help="input, staging and shards on moto's S3 server")
    points = [Point("exchange", 0.5), Point("write", 0.5), Point("write", 0.9)]
    add("--points", nargs="+", type=parse_point, default=points, help="STAGE:FRACTION ...")
    add("--clean-runs", type=int, default=1, help="clean runs; the fastest is the reference")
    add("--work-dir", default="/tmp/ballast-bench")
    add("--shards", type=int, default=24, help="output shards")
    add("--task-mb", type=int, default=64, help="exchange_task_bytes, MiB")
    parser.set_defaults(row_group_rows=8_192, raw_row_group_rows=131_072, holdout_fraction=0.0)
    add("--seed", type=int, default=0)
    add("--drop-caches", action="store_true", help="empty the page cache before each run (root)")
    add("--no-warm-up", dest="warm_up", action="store_false")
    add("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.gb = args.gb or (2.0 if args.s3 else 8.0)
    stages = {point.stage == PASS for point in args.points}
    if len(stages) > 1:  # one route per command: a pass point lifts the staged route's budget
        parser.error(f"--points: {PASS} points and exchange/write points go in separate runs")
    if args.drop_caches and not os.access(DROP_CACHES, os.W_OK):
        parser.error(f"--drop-caches writes {DROP_CACHES}: run as root on Linux, or leave it out")
    return args


def main() -> None:
    args = parse_args()
    if args.child:
        child(args.child)
        return
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    check_disk(args)
    if args.warm_up:
        warm_up(["ballast-stratified"], args)
    raw, spec = prepare(args.gb, args)
    with store(args, raw) as (source, output):
        bench(args, source, output, spec.num_rows)


if __name__ == "__main__":
    main()
