"""Ranks that are not alike: `loader.balance: equal` against `speed`, on two models.

    .venv/bin/python benchmarks/hetero_bench.py                   # about 10-15 min on 2 cores
    .venv/bin/python benchmarks/hetero_bench.py --rows 8000 --epochs 1   # a quicker look
    .venv/bin/python benchmarks/hetero_bench.py --scale 8 --token-rows 2048 --repeat 3 \
        --baseline 5ec2e20     # the last release beside this checkout, ~80 min quiet

Two single-process torchrun "nodes" on this host (`--nnodes 2`, rendezvous on
localhost), node r pinned to CPU core r with `taskset` and one thread. Three cases:
`loaded`, node 1 shares its core with a busy loop from its first step (1.4-1.6x slower,
or `--slow-by quota`: half a core); `unloaded`, both alike; `midslow`, slowed from when
rank 0 has run `--slow-at` of the run's steps (by default half of the last epoch). Each
case runs under `equal` then `speed` on two models: the demo's classifier (a raw
tabular sample resharded by ballast, then the built-in MLP; `equal-loaded`,
`speed-midslow`, ...) and the built-in transformer on a token dataset of uneven
sequences (4 to 32 real tokens, padded with id 0), each sequence run cut to its real
tokens (`tokens-equal-loaded`, ...). Two more token runs compare the split by rows with
`balance_by: tokens` (unloaded): `tokens-by-samples`, `tokens-unloaded`.

Printed per run and rank: step time, data wait, all-reduce wait (blocked), busy time
(step less all-reduce wait) and samples/s (summary.json's `<figure>_per_rank`); per run:
each epoch's wall time (rank 0's step ends; epoch 0 from the end of its first step), the
rows per rank at the last step and the global-batch loss of every step (each rank
records its loss times its `loss_scale`; their mean over ranks is the step's mean loss in
either mode). Per case and model: `speed` / `equal` wall time (last epoch, all epochs),
the largest relative difference of their per-step losses, and under `speed` the steps
from the slow-down (step 0 when loaded) until every rank's rows stay within 5 % of the
final split (the mean of the last 5 steps). Targets against equal (issue 59): loaded,
speed's first epoch <= 1.0x equal's and all epochs <= 0.85x; unloaded, all epochs <=
1.03x; token-balanced, the slower rank's forward time per step within 15 % of the median
(of the two). Every figure is printed, met or not; on a shared host they are noisy (the
load average is printed). The per-step loss against equal's is printed for reference:
in float32 another split of the same batches alone moves the MLP's losses past 1e-5
within 40 steps (benchmarks/split_order.py), so issue 59 holds a split's losses to the
same split fixed by hand instead (tests/training/test_balance_loss.py).

The oracle (benchmarks/hetero_sweep.py): after each slowed case's `equal` run (`loaded`,
`midslow`, both models), `--sweep` (7) `loader.balance: fixed` runs at splits evenly
spaced from equal to the rows-proportional split (or `--sweep-to` fast rows), and
`--sweep-beyond` (3) past it; the fastest over all epochs is `best fixed`, and `speed`
is printed against it (first epoch, all epochs: issue 59's targets 1.10x and 1.05x)
beside `equal`, with the sweep's table; with `--repeat` 2 or more, also against the
split fastest by its median over the repeats (each repeat's fastest run is the least of
several noisy runs, so below that split's usual time: hetero_sweep.py). `--sweep 0` runs none.

On a host whose speed drifts 20-40 % between runs (RESULTS.md M40): `--scale 8` (with
`--token-rows 2048`) gives epochs of 15-30 s on a quiet host; `--repeat N` runs each case
N times, interleaved, and prints the median per case of the per-repeat ratios;
`--baseline COMMIT` runs the cases' `equal` and `speed` on a `git worktree` of COMMIT as
well (removed after; PYTHONPATH and working directory at it, this checkout's
hetero_models.py and hetero_data.py copied in, its own datasets: an older ballast may
refuse a newer manifest), side by side (hetero_report.py): 78 runs for the whole grid.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import shutil
import socket
import subprocess
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from statistics import median
from typing import Any

import yaml

from benchmarks.hetero_data import datasets
from benchmarks.hetero_quota import CpuQuota, checked_slow_by
from benchmarks.hetero_report import CASES, FIGURES, Run, report, report_repeats, settle_steps
from benchmarks.hetero_sweep import (
    SWEPT_CASES,
    against_best,
    against_median_best,
    fixed_name,
    fixed_shares,
    sweep_table,
    swept_rows,
)
from training.launch.processes import child_env

ROOT = Path(__file__).resolve().parents[1]
MODEL = "benchmarks.hetero_models:TimedClassifier"
TOKEN_MODEL = "benchmarks.hetero_models:TimedTokenClassifier"


def job_config(
    dataset: str,
    run_dir: Path,
    args: argparse.Namespace,
    name: str,
    tokens: bool,
    shares: list[float] | None = None,
) -> dict[str, Any]:
    """The job of run `name`; with `shares`, that case under `balance: fixed` at them."""
    model = (
        {
            "class_path": TOKEN_MODEL,
            "transformer": {"d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 512},
        }
        if tokens
        else {"class_path": MODEL, "hidden_sizes": args.hidden}
    )
    loader: dict[str, Any] = {
        "batch_size": args.batch_size,
        "balance": RUNS[name][0] if shares is None else "fixed",
        "balance_every_n_steps": args.every,
        "num_partitions": 16,
    }
    if shares is not None:
        loader["balance_shares"] = shares
    if tokens:
        loader |= {
            "balance_by": "tokens" if name == "tokens-unloaded" else "samples",
            "batch_size": args.token_batch_size,
        }
    return {
        "dataset": dataset,
        "output_dir": str(run_dir),
        "max_epochs": args.epochs,
        "seed": 3,
        "strategy": "ddp",
        "loader": loader,
        "model": model | {"options": {"record_dir": str(run_dir / "record")}},
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def busy_loop() -> subprocess.Popen[bytes]:
    """A CPU-bound process on core 1, beside node 1."""
    return subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])


def steps_recorded(run_dir: Path) -> int:
    path = run_dir / "record" / "rank0.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def run_nodes(
    config: dict[str, Any],
    run_dir: Path,
    slow_at: int | None,
    timeout_s: float,
    slow_by: str = "busy-loop",
    code: Path = ROOT,
) -> None:
    """Two torchrun nodes of one process each, node r on core r, running the ballast at
    `code` (PYTHONPATH and working directory: `-m training` looks in the working
    directory first); node 1 slowed from rank 0's step `slow_at` on (None: never; a
    mid-run step is written to `slowed_at`) by `slow_by`. "From the start" (0) is from
    the first recorded step: the epochs are timed from there, and a slow-down through
    the nodes' imports would only take CPU from whatever else runs on the host."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a run of its own: no records appended to
    (run_dir / "record").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    port, env = free_port(), child_env({"OMP_NUM_THREADS": "1"})
    env["PYTHONPATH"] = str(code)

    def slow_down() -> subprocess.Popen[bytes] | None:
        if slow_by == "busy-loop":
            return busy_loop()
        if slow_by == "quota":  # node 1's torchrun and rank at half a core
            quota.append(CpuQuota().add(nodes[1].pid))
        else:
            (run_dir / "record" / "slow").touch()
        return None

    quota: list[CpuQuota] = []
    hog: subprocess.Popen[bytes] | None = None
    slowed = False
    logs = [open(run_dir / f"node{node}.log", "w") for node in range(2)]  # noqa: SIM115
    nodes = [
        subprocess.Popen(
            [
                "taskset",
                "-c",
                str(node),
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--master-addr",
                "127.0.0.1",
                "--master-port",
                str(port),
                "--max-restarts",
                "0",
                "-m",
                "training",
                "--config",
                str(run_dir / "config.yaml"),
            ],
            env=env,
            cwd=code,
            stdout=logs[node],
            stderr=subprocess.STDOUT,
        )
        for node in range(2)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        while any(node.poll() is None for node in nodes) and time.monotonic() < deadline:
            due = not slowed and slow_at is not None
            if due and (step := steps_recorded(run_dir)) >= max(1, slow_at or 0):
                hog, slowed = slow_down(), True
                if slow_at:
                    (run_dir / "slowed_at").write_text(str(step))
            time.sleep(0.02)
    finally:
        for process in nodes + ([hog] if hog is not None else []):
            if process.poll() is None:
                process.kill()
                process.wait()
        for group in quota:
            group.close()
        for log in logs:
            log.close()
    if any(node.returncode for node in nodes):
        tails = [(run_dir / f"node{node}.log").read_text()[-4000:] for node in range(2)]
        raise SystemExit(f"run {run_dir.name} failed:\n" + "\n".join(tails))


def read_records(run_dir: Path) -> list[list[dict[str, Any]]]:
    return [
        [
            json.loads(line)
            for line in (run_dir / "record" / f"rank{r}.jsonl").read_text().splitlines()
        ]
        for r in range(2)
    ]


def run_figures(run_dir: Path) -> Run:
    """Per-rank figures, per-epoch wall times and per-step global loss of one run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    ranks = read_records(run_dir)
    ends, walls = [step["t"] for step in ranks[0]], []
    epochs = [step["epoch"] for step in ranks[0]]
    for epoch in sorted(set(epochs)):
        last = max(i for i, e in enumerate(epochs) if e == epoch)
        first = min(i for i, e in enumerate(epochs) if e == epoch)
        walls.append(ends[last] - ends[first - 1 if first else 0])
    losses = [sum(step["loss"] for step in steps) / 2 for steps in zip(*ranks, strict=True)]
    rows = [[step["rows"] for step in rank] for rank in ranks]
    # Per step: the slower rank's forward over the two ranks' median (their mean).
    spread = [
        max(a["forward_s"], b["forward_s"]) / median([a["forward_s"], b["forward_s"]]) - 1
        for a, b in zip(*ranks, strict=True)
        if a["forward_s"] + b["forward_s"] > 0
    ]
    slowed = run_dir / "slowed_at"
    change = int(slowed.read_text()) if slowed.exists() else 0
    return {
        "per_rank": {name: summary[f"{name}_per_rank"] for name in FIGURES},
        "epoch_wall_s": walls,
        "losses": losses,
        "last_rows": [r[-1] for r in rows],
        "step_spread": sum(spread) / len(spread) if spread else None,
        "slowed_at": change,
        "settle_steps": settle_steps(rows, change),
        "moves": summary.get("balance_moves", []),
    }


GRID = {  # name: (balance, case, token dataset): each case under equal, then speed
    f"{model}{balance}-{case}": (balance, case, model == "tokens-")
    for model in ("", "tokens-")
    for case in CASES
    for balance in ("equal", "speed")
}
RUNS = GRID | {
    "tokens-by-samples": ("equal", "unloaded", True),
    "tokens-unloaded": ("equal", "unloaded", True),
}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=40_000, help="Tabular train rows.")
    parser.add_argument("--token-rows", type=int, default=4_096, help="Token dataset rows.")
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="Multiplies --rows and --token-rows (8: longer epochs).",
    )
    parser.add_argument("--batch-size", type=int, default=256, help="Rows per rank per step.")
    parser.add_argument("--token-batch-size", type=int, default=32)
    parser.add_argument(
        "--hidden",
        type=int,
        nargs="*",
        default=[512, 512],
        help="MLP widths: per-sample compute large against a step's overhead.",
    )
    parser.add_argument("--epochs", type=int, default=2, help="Epochs per run.")
    parser.add_argument("--every", type=int, default=4, help="balance_every_n_steps.")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument(
        "--repeat", type=int, default=1, help="Runs of each, interleaved; the median per case."
    )
    parser.add_argument(
        "--baseline",
        default=None,
        help="A commit (5ec2e20: the last release) whose `speed` runs beside this checkout's.",
    )
    parser.add_argument(
        "--slow-by",
        choices=["busy-loop", "sleep", "quota"],
        type=checked_slow_by,
        default="busy-loop",
        help="How node 1 is slowed: a busy loop on its core, sleeping twice its "
        "forward time in each step, or half a core's CPU quota (hetero_quota.py, root).",
    )
    parser.add_argument(
        "--slow-at",
        type=float,
        default=None,
        help="midslow: the step (fraction of the run) the busy loop starts at; "
        "default: half way through the last epoch.",
    )
    parser.add_argument(
        "--sweep",
        type=int,
        default=7,
        help="Fixed splits swept from equal to the rows-proportional split after each "
        "slowed case's `equal` run (hetero_sweep.py; 0: none).",
    )
    parser.add_argument(
        "--sweep-beyond", type=int, default=3, help="Fixed splits swept past it, same spacing."
    )
    parser.add_argument(
        "--sweep-to",
        type=int,
        default=None,
        help="The fast rank's rows a step at the sweep's far end instead of the "
        "rows-proportional split (MLP batches; the token model's scaled by its batch).",
    )
    parser.add_argument("--work-dir", default=None, help="Work directory (default: temp).")
    parser.add_argument("--timeout-s", type=float, default=900, help="Per run.")
    args = parser.parse_args()
    args.rows, args.token_rows = args.rows * args.scale, args.token_rows * args.scale
    return args


def main() -> None:
    args = parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="hetero-bench-"))
    with ExitStack() as stack:
        codes = {"": ROOT}  # run-name suffix: the ballast it runs
        data = {"": datasets(work, args.rows, args.token_rows)}
        if args.baseline:
            suffix = f"@{args.baseline}"
            codes[suffix] = stack.enter_context(checkout(args.baseline, work))
            data[suffix] = checkout_datasets(codes[suffix], work / suffix, args)
        results = run_all(args, work, codes, data)
    if args.repeat == 1 and not args.baseline:
        report({name: runs[0] for name, runs in results.items()})
    else:
        report_repeats(results, args.baseline)
    report_sweep(results)


def run_all(
    args: argparse.Namespace, work: Path, codes: dict[str, Path], data: dict[str, dict[str, str]]
) -> dict[str, list[Run]]:
    """Every run of `args.runs`, `args.repeat` times, each on every code (a baseline only
    for the cases' grid), in that order: a case's runs one after another."""
    results: dict[str, list[Run]] = defaultdict(list)
    for repeat in range(args.repeat):
        for name in args.runs:
            _, case, on_tokens = RUNS[name]
            for suffix, code in codes.items():
                if suffix and name not in GRID:
                    continue
                run_dir = work / "runs" / f"{name}{suffix}-{repeat}"
                dataset = data[suffix]["tokens" if on_tokens else "mlp"]
                config = job_config(dataset, run_dir, args, name, on_tokens)
                slow_at = slow_step(args, case, on_tokens)
                run_nodes(config, run_dir, slow_at, args.timeout_s, args.slow_by, code)
                results[name + suffix].append(run_figures(run_dir))
                if not suffix and name.endswith(f"equal-{case}") and case in SWEPT_CASES:
                    sweep(args, work, results, (name, repeat), dataset)
    return results


def sweep(
    args: argparse.Namespace,
    work: Path,
    results: dict[str, list[Run]],
    run: tuple[str, int],
    dataset: str,
) -> None:
    """A slowed case's fixed splits (benchmarks/hetero_sweep.py), after its `equal` run."""
    name, repeat = run
    _, case, on_tokens = RUNS[name]
    model = "tokens-" if on_tokens else ""
    loaded = results.get(f"{model}equal-loaded", [])
    equal = loaded[repeat] if len(loaded) > repeat else results[name][repeat]
    global_batch = 2 * (args.token_batch_size if on_tokens else args.batch_size)
    to_rows = None
    if args.sweep_to is not None:
        to_rows = round(args.sweep_to * global_batch / (2 * args.batch_size))
    for fast_rows in swept_rows(equal, global_batch, args.sweep, args.sweep_beyond, to_rows):
        label = fixed_name(model, case, fast_rows)
        run_dir = work / "runs" / f"{label}-{repeat}"
        shares = fixed_shares(fast_rows, global_batch)
        config = job_config(dataset, run_dir, args, name, on_tokens, shares)
        run_nodes(config, run_dir, slow_step(args, case, on_tokens), args.timeout_s, args.slow_by)
        results[label].append(run_figures(run_dir))


def report_sweep(results: dict[str, list[Run]]) -> None:
    """Each slowed case's sweep and `speed` against its best fixed split."""
    for model, case in ((m, c) for m in ("", "tokens-") for c in SWEPT_CASES):
        sweep_table(results, model, case)
        if line := against_best(results, model, case):
            print(f"  {model or 'mlp-'}{case}: {line}")
        if line := against_median_best(results, model, case):
            print(f"  {model or 'mlp-'}{case}: {line}")


@contextmanager
def checkout(commit: str, work: Path) -> Iterator[Path]:
    """A detached `git worktree` of `commit` in `work`, with this checkout's
    benchmarks/hetero_models.py and hetero_data.py copied in (the jobs' model classes and
    datasets); removed after."""
    path = work / f"code-{commit}"
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "--detach", "--force", str(path), commit], check=True)
    try:
        for module in ("hetero_models.py", "hetero_data.py"):
            shutil.copy(ROOT / "benchmarks" / module, path / "benchmarks")
        yield path
    finally:
        subprocess.run([*git, "remove", "--force", str(path)], check=False)


def checkout_datasets(code: Path, work: Path, args: argparse.Namespace) -> dict[str, str]:
    """The datasets written by the ballast at `code` (benchmarks/hetero_data.py)."""
    command = [sys.executable, "-m", "benchmarks.hetero_data", str(work), str(args.rows)]
    env = child_env() | {"PYTHONPATH": str(code)}
    done = subprocess.run(
        [*command, str(args.token_rows)], env=env, cwd=code, check=True, capture_output=True
    )
    return dict(json.loads(done.stdout.decode().splitlines()[-1]))


def slow_step(args: argparse.Namespace, case: str, tokens: bool) -> int | None:
    """Rank 0's step at which node 1 is slowed: 0 when loaded, None when unloaded."""
    if case != "midslow":
        return {"loaded": 0}.get(case)
    rows = args.token_rows if tokens else args.rows
    per_epoch = rows // (2 * (args.token_batch_size if tokens else args.batch_size))
    total = per_epoch * args.epochs
    fraction = args.slow_at if args.slow_at is not None else 1 - 0.5 / args.epochs
    return max(1, int(fraction * total))


if __name__ == "__main__":
    main()
