"""Ranks that are not alike: `loader.balance: equal` against `speed`, one node 2x slower.

    .venv/bin/python benchmarks/hetero_bench.py                   # about 5-8 min on 2 cores
    .venv/bin/python benchmarks/hetero_bench.py --rows 8000 --epochs 1   # a quicker look

The demo's classifier job (a raw tabular sample resharded by ballast, then the built-in
MLP) runs as two single-process torchrun "nodes" on this host (`--nnodes 2`, rendezvous
on localhost), node r pinned to CPU core r with `taskset` and one thread; node 1 shares
its core with a CPU-bound process (a busy loop), so it runs about 2x slower. Runs: equal,
then speed (loaded); equal and speed with both nodes unloaded; then the built-in
transformer on a token dataset of uneven sequences (4 to 32 real tokens, padded with id
0), each sequence run cut to its real tokens, split by rows and then with
`balance_by: tokens` (unloaded).

Printed per run and rank: step time, data wait, all-reduce wait (blocked), busy time
(step less all-reduce wait) and samples/s (summary.json's `<figure>_per_rank`); per run:
each epoch's wall time (rank 0's step ends; epoch 0 from the end of its first step) and
the global-batch loss of every step (each rank records its loss times its `loss_scale`;
their mean over ranks is the step's mean loss in either mode). Targets: loaded, speed's
last-epoch wall <= 0.75x equal's (the ideal is 0.67x); its per-step loss equals equal's
to 1e-5 relative (the same global batches); unloaded, speed costs <= 3 % over equal;
token-balanced, the slower rank's forward time per step within 15 % of the median (of
the two), on average over the steps; the split by rows is printed beside it. Every figure is
printed, met or not; on a shared host they are noisy (the load average is printed).
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
    """Appends one JSON line per train step: epoch, wall time, rows, scaled loss."""

    record_dir: Path

    def record(self, module: Any, batch: dict[str, torch.Tensor], loss: torch.Tensor,
               forward_s: float = 0.0) -> None:
        line = {"epoch": module.current_epoch, "t": time.time(), "rows": len(batch["id"]),
                "loss": float(loss.detach()), "forward_s": forward_s}
        with open(self.record_dir / f"rank{module.global_rank}.jsonl", "a") as handle:
            handle.write(json.dumps(line) + "\n")


class TimedClassifier(FeatureClassifier, StepRecord):
    """The built-in MLP, recording every step (`options.record_dir`)."""

    def __init__(self, num_features: int, classes: list[Any], model: dict[str, Any]) -> None:
        super().__init__(num_features, classes, model)
        self.record_dir = Path(model["options"]["record_dir"])

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
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
        self.record(self, batch, loss, time.perf_counter() - started)
        return loss


def tabular_dataset(work: Path, rows: int) -> str:
    """The demo's data: a raw tabular sample resharded into a committed version."""
    raw = work / f"raw-{rows}"
    if not (raw / "_DONE").exists():
        write_sample(raw, SampleSpec(num_rows=rows, num_files=8, seed=0))
        (raw / "_DONE").touch()
    config = ReshardConfig(dataset=DatasetSpec(inputs=[str(raw)], id_column="id"),
                           output_root=str(work / f"dataset-{rows}"), target_shard_rows=8192,
                           rows_per_row_group=1024, holdout_fraction=0.0, num_workers=2)
    return run_reshard(config).manifest_uri


def job_config(dataset: str, run_dir: Path, args: argparse.Namespace, balance: str,
               tokens: bool) -> dict[str, Any]:
    model = ({"class_path": TOKEN_MODEL, "transformer": {"d_model": 64, "num_layers": 2,
                                                         "num_heads": 4, "vocab_size": 512}}
             if tokens else {"class_path": MODEL, "hidden_sizes": args.hidden})
    loader = {"batch_size": args.batch_size, "balance": balance,
              "balance_every_n_steps": args.every, "num_partitions": 16}
    if tokens:
        loader |= {"balance_by": "samples" if "samples" in run_dir.name else "tokens",
                   "batch_size": args.token_batch_size}
    return {"dataset": dataset, "output_dir": str(run_dir), "max_epochs": args.epochs,
            "seed": 3, "strategy": "ddp", "loader": loader,
            "model": model | {"options": {"record_dir": str(run_dir / "record")}}}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_nodes(config: dict[str, Any], run_dir: Path, loaded: bool, timeout_s: float) -> None:
    """Two torchrun nodes of one process each, node r on core r; node 1 beside a hog."""
    shutil.rmtree(run_dir, ignore_errors=True)  # a run of its own: no records appended to
    (run_dir / "record").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    port, env = free_port(), child_env({"OMP_NUM_THREADS": "1"})
    hog = (subprocess.Popen(["taskset", "-c", "1", sys.executable, "-c", "while True: pass"])
           if loaded else None)
    nodes = [subprocess.Popen(
        ["taskset", "-c", str(node), sys.executable, "-m", "torch.distributed.run",
         "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "--max-restarts", "0",
         "-m", "training", "--config", str(run_dir / "config.yaml")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for node in range(2)]
    try:
        outputs = [node.communicate(timeout=timeout_s)[0] for node in nodes]
    finally:
        for process in nodes + ([hog] if hog is not None else []):
            if process.poll() is None:
                process.kill()
                process.wait()
    if any(node.returncode for node in nodes):
        raise SystemExit(f"run {run_dir.name} failed:\n" + "\n".join(o[-4000:] for o in outputs))


def read_records(run_dir: Path) -> list[list[dict[str, Any]]]:
    return [[json.loads(line) for line in (run_dir / "record" / f"rank{r}.jsonl").read_text()
             .splitlines()] for r in range(2)]


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
    spread = [max(a["forward_s"], b["forward_s"]) / median([a["forward_s"], b["forward_s"]])
              - 1 for a, b in zip(*ranks, strict=True) if a["forward_s"] + b["forward_s"] > 0]
    return {"per_rank": {name: summary[f"{name}_per_rank"] for name in FIGURES},
            "epoch_wall_s": walls, "losses": losses, "last_rows": [r[-1] for r in rows],
            "step_spread": sum(spread) / len(spread) if spread else None}


def print_run(name: str, run: dict[str, Any]) -> None:
    print(f"\n{name}: epoch wall s {[round(w, 2) for w in run['epoch_wall_s']]}, "
          f"rows per rank at the last step {run['last_rows']}")
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
    print("targets:")
    if {"equal-loaded", "speed-loaded"} <= set(runs):
        eq, sp = runs["equal-loaded"], runs["speed-loaded"]
        ratio = sp["epoch_wall_s"][-1] / eq["epoch_wall_s"][-1]
        total = sum(sp["epoch_wall_s"]) / sum(eq["epoch_wall_s"])
        diff = loss_difference(sp["losses"], eq["losses"])
        print(f"  speed / equal wall, one node 2x slower: last epoch {ratio:.3f}x, all epochs "
              f"{total:.3f}x (target <= 0.75x) {'met' if ratio <= 0.75 else 'NOT met'}")
        print(f"  per-step loss, speed vs equal: max relative difference {diff:.2e} "
              f"(target <= 1e-5) {'met' if diff <= 1e-5 else 'NOT met'}")
    if {"equal-unloaded", "speed-unloaded"} <= set(runs):
        cost = (sum(runs["speed-unloaded"]["epoch_wall_s"])
                / sum(runs["equal-unloaded"]["epoch_wall_s"]) - 1)
        print(f"  speed's cost unloaded: {cost:+.1%} (target <= +3%) "
              f"{'met' if cost <= 0.03 else 'NOT met'}")
    for name in ("tokens-by-samples", "tokens-unloaded"):
        if name in runs:
            busy, spread = runs[name]["per_rank"]["busy_s"], runs[name]["step_spread"]
            print(f"  {name}: slower rank's forward per step {spread:+.1%} over the median, "
                  f"on average; run busy time {max(busy) / median(busy) - 1:+.1%} "
                  + ("(target <= 15%) " + ("met" if spread <= 0.15 else "NOT met")
                     if name == "tokens-unloaded" else "(the split by rows, for reference)"))


RUNS = {  # name: (balance, loaded, token dataset)
    "equal-loaded": ("equal", True, False),
    "speed-loaded": ("speed", True, False),
    "equal-unloaded": ("equal", False, False),
    "speed-unloaded": ("speed", False, False),
    "tokens-by-samples": ("equal", False, True),
    "tokens-unloaded": ("equal", False, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=40_000, help="Tabular train rows.")
    parser.add_argument("--token-rows", type=int, default=4_096, help="Token dataset rows.")
    parser.add_argument("--batch-size", type=int, default=256, help="Rows per rank per step.")
    parser.add_argument("--token-batch-size", type=int, default=32)
    parser.add_argument("--hidden", type=int, nargs="*", default=[512, 512],
                        help="MLP widths: per-sample compute large against a step's overhead.")
    parser.add_argument("--epochs", type=int, default=2, help="Epochs per run.")
    parser.add_argument("--every", type=int, default=4, help="balance_every_n_steps.")
    parser.add_argument("--runs", nargs="*", default=list(RUNS), choices=list(RUNS))
    parser.add_argument("--work-dir", default=None, help="Work directory (default: temp).")
    parser.add_argument("--timeout-s", type=float, default=900, help="Per run.")
    args = parser.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="hetero-bench-"))
    tabular = tabular_dataset(work, args.rows)
    tokens = write_token_dataset(str(work / "tokens"), TokenDatasetSpec(
        num_rows=args.token_rows, holdout_rows=0, seq_len=32, min_seq_len=4, vocab_size=512,
        rows_per_shard=1024, rows_per_row_group=128))
    runs = {}
    for name in args.runs:
        balance, loaded, on_tokens = RUNS[name]
        run_dir = work / "runs" / name
        config = job_config(tokens if on_tokens else tabular, run_dir, args, balance, on_tokens)
        run_nodes(config, run_dir, loaded, args.timeout_s)
        runs[name] = run_figures(run_dir)
    report(runs)


if __name__ == "__main__":
    main()
