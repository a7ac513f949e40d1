"""The kill benchmark's report: a kill point's figures, its table and its verdicts (the two
readings of work lost are benchmarks/kill_bench.py's docstring's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from benchmarks.reshard_bench import GB
from benchmarks.scale_bench import report

if TYPE_CHECKING:
    from benchmarks.kill_bench import Point, Run

SLACK = 0.15  # the fixed allowance on top of the work lost
Event = tuple[str, int, int, float]  # stage, done, total, seconds since the child's spawn
KEPT = {"exchange": ("map_outputs_kept", "map_outputs"), "write": ("shards_kept", "shards")}
PASS_TARGET = 1.05  # a killed single pass's rerun, against a clean run (it keeps nothing)
COLUMNS: list[tuple[str, int, Any]] = [  # the table's: header, width, a row's cell
    ("kill point", 13, lambda r: r["point"]),
    ("killed at s", 12, lambda r: f"{r['killed_s']:.1f}"),
    ("tasks done", 11, lambda r: r["done"]),
    ("lost: stage", 12, lambda r: f"{r['lost_stage']:.2f}"),
    ("time", 6, lambda r: f"{r['lost_time']:.2f}"),
    ("rerun s", 9, lambda r: f"{r['rerun_s']:.1f}"),
    ("rerun/clean", 12, lambda r: f"{r['ratio']:.2f}x"),
    ("target", 8, lambda r: f"{r['target']:.2f}x"),
    ("kept maps", 11, lambda r: "{map_outputs_kept}/{map_outputs}".format(**r["kept"])),
    ("kept shards", 12, lambda r: "{shards_kept}/{shards}".format(**r["kept"])),
    ("identical", 10, lambda r: "yes" if r["identical"] else "NO"),
    ("RSS GB", 8, lambda r: f"{r['rss_gb']:.2f}"),
]


def row(point: Point, killed_at: Event, rerun: Run, clean: Run) -> dict[str, Any]:
    """A point's figures; the two readings of work lost are the module docstring's."""
    assert rerun.result is not None and clean.result is not None
    shards = len(clean.result["shards"])
    counts = rerun.result["kept"] or {"map_outputs_kept": 0, "map_outputs": 0, "shards": shards}
    counts = {"shards_kept": 0, **counts}
    kept, outputs = (counts[key] for key in KEPT.get(point.stage, KEPT["write"]))
    ahead = next((e[3] for e in clean.events if e[:3] == killed_at[:3]), killed_at[3])
    same = rerun.result["version_id"] == clean.result["version_id"]
    return {
        "point": point.name,
        "killed_s": killed_at[3],
        "done": "{1}/{2}".format(*killed_at),
        "lost_stage": 1 - kept / outputs,
        "lost_time": 1 - ahead / clean.wall_s,
        "rerun_s": rerun.wall_s,
        "ratio": rerun.wall_s / clean.wall_s,
        "identical": same and rerun.digests == clean.digests,
        "rss_gb": rerun.peaks.total / GB,
        "split": breakdown(rerun),
        "kept": counts,
        "resumed": rerun.result["resumed"] or "nothing kept (a single pass stages nothing)",
        "target": PASS_TARGET if point.stage not in KEPT else SLACK + 1 - kept / outputs,
    }


def breakdown(run: Run) -> str:
    """Where a run's wall time went, in seconds."""
    assert run.result is not None
    t = run.result["timings_s"]
    parts = {
        "start-up": run.wall_s - run.result["reshard_s"],
        "cluster start": t["cluster_s"],
        "scan": t["scan_s"],
        "verify": t["verify_s"],
        "of which shards": t["shards_s"],
        "exchange tasks": t.get("exchange_s", t["verify_s"]) - t["verify_s"],
        "write": t["write_s"],
    }
    parts["rest"] = run.wall_s - sum(parts.values()) + t["shards_s"]
    return ", ".join(f"{name} {seconds:.1f}" for name, seconds in parts.items())


def table(rows: list[dict[str, Any]]) -> str:
    """One line per kill point that ran through (verdicts() says why another did not)."""
    lines = ["".join(f"{head:>{width}}" for head, width, _ in COLUMNS)]
    lines += [
        "".join(f"{cell(r):>{w}}" for _, w, cell in COLUMNS) for r in rows if "error" not in r
    ]
    return "\n".join(lines)


def verdicts(rows: list[dict[str, Any]]) -> None:
    """[PASS] / [FAIL] per point: the target on both readings, byte-identical shards."""
    for row in rows:
        if "error" in row:
            report(f"{row['point']}: killed and rerun", False, row["error"])
            continue
        name = f"{row['point']}: rerun/clean"
        if row["point"].startswith("pass"):  # nothing to keep: one target
            ok = row["ratio"] <= PASS_TARGET
            report(f"{name} <= {PASS_TARGET}", ok, f"{row['ratio']:.2f}x")
        for reading in ("stage", "time") if not row["point"].startswith("pass") else ():
            target = SLACK + row[f"lost_{reading}"]
            ok, figures = row["ratio"] <= target, f"{row['ratio']:.2f}x <= {target:.2f}x"
            report(f"{name} <= {SLACK} + work lost ({reading} reading)", ok, figures)
        report(f"{row['point']}: byte-identical, same version", row["identical"], row["resumed"])
        print(f"    {row['point']} rerun, seconds: {row['split']}")
