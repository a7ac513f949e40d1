"""Ranks that are not alike: `loader.balance: equal` against `speed`, on two models.

    .venv/bin/python benchmarks/hetero_bench.py                   # about 10-15 min on 2 cores
    .venv/bin/python benchmarks/hetero_bench.py --rows 8000 --epochs 1   # a quicker look

Two single-process torchrun "nodes" on this host (`--nnodes 2`, rendezvous on
localhost), node r pinned to CPU core r with `taskset` and one thread. Three cases:
`loaded`, node 1 shares its core with a CPU-bound process (a busy loop) from the start,
so it runs about 2x slower; `unloaded`, both alike; `midslow`, the busy loop starts when
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
final split (the mean of the last 5 steps). Targets: loaded, speed's last-epoch wall <=
0.75x equal's (the ideal is 0.67x); per-step loss within 1e-5 relative (the same global
batches); unloaded, speed costs <= 3 % over equal; token-balanced, the slower rank's
forward time per step within 15 % of the median (of the two). Every figure is printed,
met or not; on a shared host they are noisy (the load average is printed).
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from statistics import median
from typing import Any

import torch
import yaml

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.synthetic.tokens import TokenDatasetSpec, write_token_dataset
from training.launch.processes import child_env
from training.models.classifier import FeatureClassifier
from training.models.transformer import TokenClassifier

MODEL = "benchmarks.hetero_bench:TimedClassifier"
TOKEN_MODEL = "benchmarks.hetero_bench:TimedTokenClassifier"
FIGURES = ("step_s", "data_wait_s", "allreduce_blocked_s", "busy_s", "samples_per_s")


class StepRecord:
    """Appends one JSON line per train step: epoch, wall time, rows, scaled loss. With
    `--slow-by sleep`, rank 1 sleeps twice its step's forward time (forward + backward
    about 3x forward: about 2x slower) while the file `slow` is in the record directory."""

    record_dir: Path

    def slowed(self, module: Any, started: float) -> None:
        if module.global_rank == 1 and (self.record_dir / "slow").exists():
            time.sleep(2 * (time.perf_counter() - started))

    def record(
        self,
        module: Any,
        batch: dict[str, torch.Tensor],
        loss: torch.Tensor,
        forward_s: float = 0.0,
    ) -> None:
        line = {
            "epoch": module.current_epoch,
            "t": time.time(),
            "rows": len(batch["id"]),
            "loss": float(loss.detach()),
            "forward_s": forward_s,
        }
        with open(self.record_dir / f"rank{module.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(line) + "\n")


class TimedClassifier(FeatureClassifier, StepRecord):
    """The built-in MLP, recording every step (`options.record_dir`)."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        started = time.perf_counter()
        loss = super().training_step(batch, batch_idx)
        self.slowed(self, started)
        self.record(self, batch, loss)
        return loss


class TimedTokenClassifier(TokenClassifier, StepRecord):
    """The built-in transformer, recording every step (`options.record_dir`) with its
    forward seconds; it runs each sequence cut to its real tokens (id 0 pads), so that a
    row costs what its tokens cost, as packed or variable-length attention would."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        lengths = (features != 0).sum(dim=1).clamp_min(1).tolist()
        return torch.cat([self.net(features[i : i + 1, :n]) for i, n in enumerate(lengths)])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        started = time.perf_counter()
        loss = super().training_step(batch, batch_idx)
        forward_s = time.perf_counter() - started
        self.slowed(self, started)
        self.record(self, batch, loss, forward_s)
        return loss


def tabular_dataset(work: Path, rows: int) -> str:
    """The demo's data: a raw tabular sample resharded into a committed version."""
    raw = work / f"raw-{rows}"
    if not (raw / "_DONE").exists():
        write_sample(raw, SampleSpec(num_rows=rows, num_files=8, seed=0))
        (raw / "_DONE").touch()
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)], id_column="id"),
        output_root=str(work / f"dataset-{rows}"),
        target_shard_rows=8192,
        rows_per_row_group=1024,
        holdout_fraction=0.0,
        num_workers=2,
    )
    return run_reshard(config).manifest_uri


def job_config(
    dataset: str, run_dir: Path, args: argparse.Namespace, balance: str, tokens: bool
) -> dict[str, Any]:
    model = (
        {
            "class_path": TOKEN_MODEL,
            "transformer": {"d_model": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 512},
        }
        if tokens
        else {"class_path": MODEL, "hidden_sizes": args.hidden}
    )
    loader = {
        "batch_size": args.batch_size,
        "balance": balance,
        "balance_every_n_steps": args.every,
        "num_partitions": 16,
    }
    if tokens:
        loader |= {
            "balance_by": "tokens" if run_dir.name == "tokens-unloaded" else "samples",
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
) -> None:
    """Two torchrun nodes of one process each, node r on core r; node 1 slowed from rank
    0's step `slow_at` on (0: from the start; None: never; written to `slowed_at`) by a
    busy loop beside it or (`slow_by` sleep) by sleeping in its steps."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a run of its own: no records appended to
    (run_dir / "record").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    port, env = free_port(), child_env({"OMP_NUM_THREADS": "1"})

    def slow_down() -> subprocess.Popen[bytes] | None:
        if slow_by == "busy-loop":
            return busy_loop()
        (run_dir / "record" / "slow").touch()
        return None

    hog, slowed = (slow_down(), True) if slow_at == 0 else (None, False)
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
            stdout=logs[node],
            stderr=subprocess.STDOUT,
        )
        for node in range(2)
    ]
    deadline = time.monotonic() + timeout_s
    try:
        while any(node.poll() is None for node in nodes) and time.monotonic() < deadline:
            if not slowed and slow_at and (step := steps_recorded(run_dir)) >= slow_at:
                hog, slowed = slow_down(), True
                (run_dir / "slowed_at").write_text(str(step))
            time.sleep(0.02)
    finally:
        for process in nodes + ([hog] if hog is not None else []):
            if process.poll() is None:
                process.kill()
                process.wait()
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


def run_figures(run_dir: Path) -> dict[str, Any]:
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


def settle_steps(rows: list[list[int]], change: int) -> int | None:
    """Steps from `change` until every rank's rows stay within 5 % of the final split (the
    mean of the last 5 steps); None when they never do."""
    final = [sum(rank[-5:]) / len(rank[-5:]) for rank in rows]
    steps = len(rows[0])
    within = [
        all(abs(rank[s] - f) <= 0.05 * f for rank, f in zip(rows, final, strict=True))
        for s in range(steps)
    ]
    for step in range(change, steps):
        if all(within[step:]):
            return step - change
    return None


def print_run(name: str, run: dict[str, Any]) -> None:
    print(
        f"\n{name}: epoch wall s {[round(w, 2) for w in run['epoch_wall_s']]}, "
        f"rows per rank at the last step {run['last_rows']}"
    )
    print(f"  {'rank':<5}" + "".join(f"{figure:>20}" for figure in FIGURES))
    for rank in range(2):
        print(f"  {rank:<5}" + "".join(f"{run['per_rank'][f][rank]:>20.4f}" for f in FIGURES))
    print("  loss per step: " + " ".join(f"{loss:.6f}" for loss in run["losses"]))


def loss_difference(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two runs' per-step losses."""
    return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a, b, strict=True))


def report(runs: dict[str, dict[str, Any]]) -> None:
    for name, run in runs.items():
        print_run(name, run)
    print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores: noisy figures")
    print(
        "targets: speed / equal wall (last epoch, all epochs); loss (max relative "
        "difference per step); settle (steps from the slow-down to within 5 % of the "
        "final split)"
    )
    for model, case in ((m, c) for m in ("", "tokens-") for c in CASES):
        eq, sp = runs.get(f"{model}equal-{case}"), runs.get(f"{model}speed-{case}")
        if eq is not None and sp is not None:
            print_case(f"{model or 'mlp-'}{case}", case, eq, sp)
    for name in ("tokens-by-samples", "tokens-unloaded"):
        if name in runs:
            busy, spread = runs[name]["per_rank"]["busy_s"], runs[name]["step_spread"]
            print(
                f"  {name}: slower rank's forward per step {spread:+.1%} over the median, "
                f"on average; run busy time {max(busy) / median(busy) - 1:+.1%} "
                + (
                    "(target <= 15%) " + ("met" if spread <= 0.15 else "NOT met")
                    if name == "tokens-unloaded"
                    else "(the split by rows, for reference)"
                )
            )


def print_case(label: str, case: str, eq: dict[str, Any], sp: dict[str, Any]) -> None:
    """One line of a case's figures against its target."""
    last = sp["epoch_wall_s"][-1] / eq["epoch_wall_s"][-1]
    total = sum(sp["epoch_wall_s"]) / sum(eq["epoch_wall_s"])
    diff = loss_difference(sp["losses"], eq["losses"])
    target = {"loaded": 0.75, "unloaded": 1.03}.get(case)
    verdict = (
        ""
        if target is None
        else (f"(target <= {target}x: " + ("met" if last <= target else "NOT met") + ")")
    )
    print(
        f"  {label}: speed / equal {last:.3f}x last epoch, {total:.3f}x all {verdict}; "
        f"loss {diff:.2e} ({'met' if diff <= 1e-5 else 'NOT met'}); settle "
        f"{sp['settle_steps']} steps from step {sp['slowed_at']}; rows at the end "
        f"{sp['last_rows']}; moves logged {len(sp['moves'])}"
    )


CASES = ("loaded", "unloaded", "midslow")
RUNS = {  # name: (balance, case, token dataset)
    **{
        f"{model}{balance}-{case}": (balance, case, model == "tokens-")
        for model in ("", "tokens-")
        for case in CASES
        for balance in ("equal", "speed")
    },
    "tokens-by-samples": ("equal", "unloaded", True),
    "tokens-unloaded": ("equal", "unloaded", True),
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=40_000, help="Tabular train rows.")
    parser.add_argument("--token-rows", type=int, default=4_096, help="Token dataset rows.")
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
        "--slow-by",
        choices=["busy-loop", "sleep"],
        default="busy-loop",
        help="How node 1 is slowed: a busy loop on its core, or sleeping "
        "twice its forward time in each step (the same 2x whatever else "
        "runs on the host).",
    )
    parser.add_argument(
        "--slow-at",
        type=float,
        default=None,
        help="midslow: the step (fraction of the run) the busy loop starts at; "
        "default: half way through the last epoch.",
    )
    parser.add_argument("--work-dir", default=None, help="Work directory (default: temp).")
    parser.add_argument("--timeout-s", type=float, default=900, help="Per run.")
    args = parser.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="hetero-bench-"))
    tabular = tabular_dataset(work, args.rows)
    tokens = write_token_dataset(
        str(work / "tokens"),
        TokenDatasetSpec(
            num_rows=args.token_rows,
            holdout_rows=0,
            seq_len=32,
            min_seq_len=4,
            vocab_size=512,
            rows_per_shard=1024,
            rows_per_row_group=128,
        ),
    )
    runs = {}
    for name in args.runs:
        balance, case, on_tokens = RUNS[name]
        run_dir = work / "runs" / name
        config = job_config(tokens if on_tokens else tabular, run_dir, args, balance, on_tokens)
        run_nodes(config, run_dir, slow_step(args, case, on_tokens), args.timeout_s, args.slow_by)
        runs[name] = run_figures(run_dir)
    report(runs)


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
