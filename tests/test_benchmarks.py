"""Every benchmark runs the way its docstring says, at its smallest size, so none can rot:
as a script from another directory (`python benchmarks/NAME.py`) or as a module from the
clone (`python -m benchmarks.NAME`), with no PYTHONPATH (the scripts find the clone)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # each one a subprocess, most with a Dask cluster or torchrun

ROOT = Path(__file__).resolve().parents[1]
NO_LITDATA = "/nonexistent/litdata-python"
WORK = ["--work-dir", "{tmp}/work"]
# name -> (how it is run, its smallest-size arguments, a line its output must hold)
SMALLEST = {
    "plan_bench": ("script", ["--files", "1000"], "plan_split train stratified"),
    "scan_record_bench": (
        "script",
        ["--files", "4", "--rows", "4000", "--synthetic", "20", "--sketches", "1", "--repeat", "1"],
        "scan record of 20 files",
    ),
    "reshard_bench": (
        "module",
        [
            "--gb",
            "0.001",
            "--shards",
            "2",
            "--tools",
            "ballast-stratified",
            "ballast-groups",
            "ballast-newest",
            "pyarrow-write_dataset",
            "polars-sort",
            "polars-streaming-sort",
            "daft-sort",
            "floor",
            "floor-two-pass",
            "floor-shuffle",
            "--no-warm-up",
            *WORK,
        ],
        "stratified / floor-shuffle: wall",
    ),
    "incremental_bench": (
        "script",
        ["--gb", "0.001", "--shards", "2", "--repeat", "1", *WORK],
        "incremental",
    ),
    "scale_bench": (
        "module",
        [
            "--cases",
            "bookkeeping",
            "s3",
            "--bookkeeping",
            "100x10",
            "--s3-gb",
            "0.001",
            "--s3-task-mb",
            "64",
            "--shards",
            "2",
            *WORK,
        ],
        "(b) bookkeeping at 100 pieces x 10 shards",
    ),
    "loader_bench": (
        "script",
        [
            "--rows",
            "20000",
            "--num-shards",
            "100",
            "--peer-rows",
            "2000",
            "--tabular-rows",
            "2000",
            "--stall-batches",
            "4",
            "--steady-after",
            "8",
            "--repeat",
            "1",
            "--ranks",
            "1",
            "--quality-epochs",
            "1",
            "--litdata-python",
            NO_LITDATA,
            *WORK,
        ],
        "targets:",
    ),
    "hetero_bench": (
        "script",
        [
            "--rows",
            "2000",
            "--token-rows",
            "256",
            "--batch-size",
            "32",
            "--hidden",
            "8",
            "--epochs",
            "1",
            "--runs",
            "speed-loaded",
            "tokens-unloaded",
            *WORK,
        ],
        "targets:",
    ),
    "wide_case": (
        "script",
        ["--rows", "256", "--columns", "80", "--repeat", "1", "--batch-size", "64", *WORK],
        "loader / pyarrow ParquetFile:",
    ),
    "split_order": ("script", ["--steps", "5"], "384/128 against 256/256: largest"),
    "diamonds_study": (
        "script",
        ["--table", "wine", "--variants", "epochs=1,scale=1.0", *WORK],
        '"variant": "epochs=1,scale=1.0"',
    ),
    "group_leak": ("script", ["--seeds", "1", *WORK], "ballast groups"),
    "comm_bench": (
        "module",
        ["--steps", "2", "--epochs", "1", "--only", "none", "--out", "{tmp}/out"],
        '"none"',
    ),
}


def run_benchmark(
    name: str, how: str, args: list[str], cwd: Path, timeout_s: float = 600
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = (
        [sys.executable, str(ROOT / "benchmarks" / f"{name}.py")]
        if how == "script"
        else [sys.executable, "-m", f"benchmarks.{name}"]
    )
    return subprocess.run(
        [*command, *args],
        cwd=ROOT if how == "module" else cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


# Benchmarks that start several training or reshard runs each (torchrun jobs, a killed run
# and its rerun) run in the nightly tier (`make nightly`): together about 170 s of the
# suite's 15 minutes.
SEVERAL_RUNS = {"hetero_bench", "loader_bench", "comm_bench"}
BENCHMARKS = [
    pytest.param(name, marks=[pytest.mark.nightly] if name in SEVERAL_RUNS else [])
    for name in sorted(SMALLEST)
]


@pytest.mark.parametrize("name", BENCHMARKS)
def test_each_benchmark_runs_at_its_smallest_size(name: str, tmp_path: Path) -> None:
    """Invariant: the benchmark imports, runs every section it is given end to end on
    tiny data and prints its report (exit status 0, its report's line present)."""
    how, args, expected = SMALLEST[name]
    done = run_benchmark(name, how, [arg.format(tmp=tmp_path) for arg in args], tmp_path)
    assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    assert expected in done.stdout, done.stdout[-3000:]


@pytest.mark.nightly  # a clean run, a killed run and its rerun
def test_kill_bench_reruns_a_reshard_killed_mid_write_to_the_clean_runs_shards(
    tmp_path: Path,
) -> None:
    """Invariant: kill_bench at a tiny size, its reshard SIGKILLed (driver and workers) at
    half its write tasks, reruns it to shards byte-identical to its clean run's with the
    same version id ([PASS] on that line, `yes` in the table), and prints the rerun's
    wall time against the clean run's on both readings of the work lost, and what the
    rerun kept. Its speed target is not asserted: at this size start-up is all there is."""
    args = ["--gb", "0.005", "--shards", "8", "--points", "write:0.5", "--no-warm-up"]
    done = run_benchmark(
        "kill_bench", "script", [*args, "--work-dir", str(tmp_path / "work")], tmp_path
    )
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    out = done.stdout
    kept = r"resumed: \d of 8 map outputs and \d of 8 shards kept"
    assert re.search(rf"\[PASS\] write 50%: byte-identical, same version: {kept}", out), out
    for reading in ("stage", "time"):
        assert f"write 50%: rerun/clean <= 0.15 + work lost ({reading} reading)" in out, out
    (row,) = [line for line in out.splitlines() if re.match(r"\s+write 50%\s+\d", line)]
    assert row.split()[-2] == "yes" and row.split()[-3].endswith("/8"), row


def test_reshard_bench_without_duckdb_says_to_install_the_bench_extra(tmp_path: Path) -> None:
    """Invariant: asked for the DuckDB tools where DuckDB is missing, the reshard benchmark
    stops before any work with a line naming the `bench` extra, not a traceback."""
    if importlib.util.find_spec("duckdb") is not None:
        pytest.skip("DuckDB is installed here: the message is for a clone without the extra")
    done = run_benchmark("reshard_bench", "script", ["--work-dir", str(tmp_path)], tmp_path)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "duckdb not installed: install the `bench` extra" in done.stderr
    assert not any(tmp_path.iterdir())


def test_reshard_bench_skips_a_missing_peer_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Invariant: a tool of the `peers` extra whose package cannot be imported is left out
    of the run with one printed line naming it and the extra; the other tools stay."""
    from benchmarks import reshard_bench

    # A package name no environment has stands for Daft missing from this one.
    monkeypatch.setitem(reshard_bench.OPTIONAL_PEERS, "daft-sort", "daft_missing_here")
    kept = reshard_bench.skip_optional_peers(["daft-sort", "polars-sort", "pyarrow-write_dataset"])
    assert kept == ["polars-sort", "pyarrow-write_dataset"]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and "skipping daft-sort: daft_missing_here not installed" in lines[0]
    assert "`peers` extra" in lines[0]


def test_litdata_share_imports_from_a_clone(tmp_path: Path) -> None:
    """Invariant: the LitData helper, run by loader_bench when LitData's own environment
    exists (docs/architecture.md M13), imports as a script: without arguments it fails on
    the missing argument, not on an import."""
    done = run_benchmark("litdata_share", "script", [], tmp_path, timeout_s=120)
    assert "ModuleNotFoundError" not in done.stderr and "IndexError" in done.stderr


def test_gpu_check_says_so_without_a_gpu(tmp_path: Path) -> None:
    """Invariant: on a machine without CUDA the GPU check says so and exits 0 (with a GPU it
    trains for minutes: run it by hand there)."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA GPU is here: benchmarks/gpu_check.sh takes minutes, run it by hand")
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_check.sh")],
        cwd=tmp_path,
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and "no CUDA GPU is visible" in done.stdout


def test_ui_screens_without_chromium_says_how_to_install_it(tmp_path: Path) -> None:
    """Invariant: the UI screenshot script, where no Chromium is on PATH, stops before
    starting any server with a line saying how to install it, not a traceback."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env["PATH"] = str(Path(sys.executable).parent)  # this Python, no browser
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ui_screens.py"),
            "--work-dir",
            str(tmp_path / "work"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "apt-get install -y chromium" in done.stderr
    assert not (tmp_path / "work").exists()


def hetero_run(walls: list[float], loss: float) -> dict[str, Any]:
    """One run's figures as benchmarks/hetero_bench.py's `run_figures` gives them."""
    return {
        "epoch_wall_s": walls,
        "losses": [loss, loss],
        "last_rows": [382, 130],
        "settle_steps": 6,
        "slowed_at": 0,
        "moves": [],
    }


def test_hetero_report_gives_each_codes_median_of_its_repeats_ratios(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: with repeats and a baseline commit, a case's line per code gives the
    median over repeats of speed / equal, each repeat's `speed` over the same repeat's
    `equal` of the same code (not the median of `speed` over the median of `equal`),
    the largest loss difference of any repeat, issue 59's targets against equal (first
    epoch, all epochs) judged on those medians, and the table one row with both codes."""
    from benchmarks.hetero_report import report_repeats

    equal = [[2.0, 4.0], [2.0, 8.0], [2.0, 2.0]]
    speed = [[1.0, 2.0], [1.0, 6.0], [1.0, 1.8]]  # last epoch 0.5x, 0.75x, 0.9x
    base = [[2.0, 4.0], [2.0, 8.0], [2.0, 2.0]]  # 1x each
    results = {
        "equal-loaded": [hetero_run(w, 1.0) for w in equal],
        "speed-loaded": [hetero_run(w, 1.0 + 1e-6 * i) for i, w in enumerate(speed)],
        "equal-loaded@abc": [hetero_run(w, 1.0) for w in equal],
        "speed-loaded@abc": [hetero_run(w, 1.0) for w in base],
    }
    report_repeats(results, "abc")
    out = capsys.readouterr().out
    main = "mlp-loaded, main: speed / equal median 0.500x first epoch, 0.750x last epoch"
    assert f"{main} (0.500, 0.750, 0.900), 0.700x all" in out
    assert "loss 2.00e-06" in out and "(targets first <= 1.0x: met, all <= 0.85x: met)" in out
    assert "mlp-loaded, abc: speed / equal median 1.000x first epoch, 1.000x last epoch" in out
    assert "(targets first <= 1.0x: met, all <= 0.85x: NOT met)" in out
    row = "| mlp-loaded (first 1.0, all 0.85) | 4.00 | 0.750x, 0.700x | 4.00 | 1.000x, 1.000x |"
    assert row in out


def test_hetero_sweep_spaces_its_splits_and_rates_speed_against_the_fastest(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: the fixed splits swept run evenly from equal (excluded) to the split by
    rows per busy second and past it, distinct, leaving the slow rank a row; `best fixed`
    is the fastest over all epochs of those and `equal`, per repeat; `speed`'s ratios to it
    are each repeat's over the same repeat's best, first epoch and all epochs; and against
    the split fastest by its median over the repeats, speed's median over that split's."""
    from benchmarks.hetero_sweep import (
        against_best,
        against_median_best,
        best_fixed,
        fixed_name,
        swept_rows,
    )

    equal = hetero_run([4.0, 4.0], 1.0) | {"per_rank": {"busy_s": [1.0, 3.0]}}  # 3/4 by speed
    assert swept_rows(equal, 512, 4, 2) == [288, 320, 352, 384, 416, 448]
    assert swept_rows(equal, 8, 7, 3) == [5, 6, 7]
    assert swept_rows(equal, 512, 2, 0, to_rows=448) == [352, 448]
    results = {
        "equal-loaded": [equal, equal],
        fixed_name("", "loaded", 384): [hetero_run([2.0, 3.0], 1.0), hetero_run([3.0, 3.0], 1.0)],
        fixed_name("", "loaded", 320): [hetero_run([3.0, 3.0], 1.0), hetero_run([2.5, 3.0], 1.0)],
        "speed-loaded": [hetero_run([2.2, 3.0], 1.0), hetero_run([2.5, 3.3], 1.0)],
    }
    best = best_fixed(results, "", "loaded", 0)
    assert best is not None and best["name"] == "fixed384-loaded"
    line = against_best(results, "", "loaded")
    assert "1.050x first epoch (1.100, 1.000)" in line and "1.047x all (1.040, 1.055)" in line
    assert "['fixed384-loaded', 'fixed320-loaded']" in line
    assert against_best(results, "", "midslow") == ""
    # By each split's median over the repeats: fixed384 (5.5 s), speed 5.5 s, first
    # epochs 2.35 against 2.5.
    line = against_median_best(results, "", "loaded")
    assert "(fixed384-loaded): 0.940x first epoch, 1.000x all" in line
    assert against_median_best({k: v[:1] for k, v in results.items()}, "", "loaded") == ""


def test_hetero_modelled_replays_a_hosts_speed_per_step_and_rank(tmp_path: Path) -> None:
    """Invariant: a replayed host is, per step and rank, the CPU the step took over the
    rank's median, the warm-up left out; under it a fixed split's step is the slower rank's
    work scaled by its speed then; and on an even host the fastest fixed split (best_s's)
    is the one whose ranks' work differs by less than a row of the slower's."""
    import numpy as np

    from benchmarks.hetero_modelled import CASES, ROWS, WARM, best_s, fixed_times, host_trace

    (tmp_path / "record").mkdir()
    steps = [0.5] * WARM + [0.1, 0.1, 0.1, 0.1, 0.2, 0.1, 0.1]  # rank 0's CPU a step
    for rank in range(2):  # rank 1 takes twice the CPU: the same speeds over its median
        cpu = np.cumsum([0.0, *steps]) * (rank + 1)
        lines = [json.dumps({"cpu_s": float(c), "rows": 1}) for c in cpu]
        (tmp_path / "record" / f"rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    host = host_trace(tmp_path)
    assert np.allclose(host, np.array([[1, 1, 1, 1, 2, 1, 1]] * 2).T)
    ranks = CASES["rows 2x"]
    times = fixed_times(ranks, host)
    assert times.shape == (7, ROWS - 1)
    fast = 300  # column fast - 1
    work = [ranks[0][r] + ranks[1][r] * rows for r, rows in enumerate((fast, ROWS - fast))]
    assert times[4, fast - 1] == pytest.approx(2 * max(work))
    assert times[0, fast - 1] == pytest.approx(max(work))
    best = int(times[0].argmin()) + 1
    at_best = [ranks[0][r] + ranks[1][r] * rows for r, rows in enumerate((best, ROWS - best))]
    assert abs(at_best[0] - at_best[1]) < max(ranks[1])
    assert best_s(ranks) == pytest.approx(max(at_best))
