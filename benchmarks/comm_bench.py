"""Gradient communication and sharding on the transformer preset, 2 CPU ranks (gloo).

    .venv/bin/python benchmarks/comm_bench.py                 # about 6-10 min on 2 cores
    .venv/bin/python benchmarks/comm_bench.py --steps 40      # a quicker look

Generates a token dataset (preprocessing/synthetic/tokens.py) sized for `--steps` optimizer steps
per epoch, then trains the built-in transformer (default sizes: 4 blocks, width 256,
vocabulary 4096: 4.3 M parameters, 17 MB of fp32 gradient per step) for 2 epochs on 2
ranks, once per DDP comm option: none, fp16, bf16, PowerSGD rank 1 and 4, post-local
SGD (period 4); all with the same data, seed and warm-up (10% of the steps). The six
DDP runs share one torchrun job (torch is imported once); FSDP2 runs in a job of its
own so that its peak RSS is its own (a process's peak only grows; DDP "none" runs
first in its job, so its peak is its own too).

Printed per run: step time (loader wall time / batches), all-reduce MiB per step
(mean over all steps, and steady: after the warm-up, whose steps all-reduce the full
gradient), all-reduce ms per step, the compute/comm ratio, bytes and final loss
relative to `none` (final loss: mean train loss of the last epoch), validation F1;
then FSDP2 vs DDP per rank: parameter and optimizer-state bytes, and peak RSS.
Targets: bf16 halves the bytes; PowerSGD rank 4 cuts steady bytes at least 10x with
a final loss within 2% of `none`.
"""

from __future__ import annotations

import sys
from pathlib import Path

# `python benchmarks/NAME.py` puts benchmarks/ first on sys.path, `python -m benchmarks.NAME`
# the working directory: either way the repository root goes first, for `benchmarks.*` and
# for ballast itself in a clone without an install.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import subprocess
import tempfile
from typing import Any

from preprocessing.synthetic.tokens import TokenDatasetSpec, write_token_dataset
from training.config import TrainConfig
from training.launch.processes import child_env

BATCH_SIZE, WORLD_SIZE = 16, 2
DDP_RUNS: dict[str, dict[str, Any]] = {
    "none": {"hook": "none"},
    "fp16": {"hook": "fp16"},
    "bf16": {"hook": "bf16"},
    "powersgd-r1": {"hook": "powersgd", "powersgd_rank": 1},
    "powersgd-r4": {"hook": "powersgd", "powersgd_rank": 4},
    "post-local-sgd": {"hook": "post_local_sgd", "local_sgd_period": 4},
}
MIB = 2**20
OPTIMIZER = "adamw:0.001"  # NAME:LEARNING_RATE; `sgd` is SGD with Nesterov momentum 0.9


def job_config(
    dataset: str, out: str, name: str, warmup: int, epochs: int, optimizer: str = OPTIMIZER
) -> TrainConfig:
    optimizer_name, learning_rate = optimizer.split(":")
    comm = DDP_RUNS.get(name, {"hook": "none"}) | {"warmup_steps": warmup}
    return TrainConfig.model_validate(
        {
            "dataset": dataset,
            "output_dir": f"{out}/{name}",
            "max_epochs": epochs,
            "seed": 11,
            "strategy": "fsdp" if name == "fsdp" else "ddp",
            "comm": comm if name != "fsdp" else {"hook": "none"},
            "loader": {"batch_size": BATCH_SIZE},
            "model": {
                "class_path": "transformer",
                "optimizer": optimizer_name,
                "learning_rate": float(learning_rate),
            },
        }
    )


def worker(
    dataset: str, out: str, names: list[str], warmup: int, epochs: int, optimizer: str
) -> None:
    """One rank: train each named run in turn (started by torchrun, see `launch`)."""
    from training.train import exit_rank, run_training

    for name in names:
        run_training(job_config(dataset, out, name, warmup, epochs, optimizer))
    exit_rank(0)


def launch(
    dataset: str, out: str, names: list[str], warmup: int, epochs: int, optimizer: str
) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(WORLD_SIZE),
        "--max-restarts",
        "0",
        __file__,
        "--worker",
        "--dataset",
        dataset,
        "--out",
        out,
        "--warmup",
        str(warmup),
        "--epochs",
        str(epochs),
        "--optimizer",
        optimizer,
        "--names",
        *names,
    ]
    done = subprocess.run(command, env=child_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"benchmark job failed:\n{done.stderr[-6000:]}")


def comm_row(name: str, run: dict[str, Any], base: dict[str, Any], warmup: int) -> str:
    comm, steps = run["comm"], run["comm"]["steps"]
    full = base["comm"]["allreduce_bytes_per_step"]
    steady = comm["allreduce_bytes_per_step"]
    if DDP_RUNS[name]["hook"] in ("powersgd", "post_local_sgd"):
        steady = (comm["allreduce_bytes_total"] - warmup * full) / (steps - warmup)
    step_s = run["loader"]["wall_s"] / run["loader"]["batches"]
    comm_s = comm["allreduce_s_per_step"]
    ratio = max(step_s - comm_s, 0) / comm_s if comm_s else float("inf")
    loss_change = run["train_loss"] / base["train_loss"] - 1
    return (
        f"{name:<15} {step_s * 1e3:8.1f} {comm['allreduce_bytes_per_step'] / MIB:9.2f} "
        f"{steady / MIB:9.3f} {full / max(steady, 1):8.1f}x {comm_s * 1e3:9.1f} "
        f"{ratio:8.1f} {run['train_loss']:8.4f} {loss_change:+8.2%} "
        f"{run['val_macro_f1']:6.3f}"
    )


def memory_row(name: str, run: dict[str, Any]) -> str:
    return (
        f"{name:<6} {run['param_bytes_per_rank'][0] / MIB:10.2f} "
        f"{run['optimizer_state_bytes_per_rank'][0] / MIB:12.2f} "
        f"{max(run['peak_memory_bytes_per_rank']) / MIB:14.0f} "
        f"{run['train_loss']:8.4f}"
    )


def report(runs: dict[str, dict[str, Any]], warmup: int) -> None:
    steps = runs["none"]["comm"]["steps"]
    print(f"\nDDP comm options: 2 ranks (gloo, CPU), {steps} steps, warm-up {warmup}")
    print(
        f"{'option':<15} {'step ms':>8} {'MiB/step':>9} {'steady':>9} {'cut':>9} "
        f"{'comm ms':>9} {'cmp/comm':>8} {'loss':>8} {'vs none':>8} {'F1':>6}"
    )
    for name in DDP_RUNS:
        print(comm_row(name, runs[name], runs["none"], warmup))
    print("\nFSDP2 vs DDP, per rank")
    print(f"{'run':<6} {'params MiB':>10} {'optim MiB':>12} {'peak RSS MiB':>14} {'loss':>8}")
    print(memory_row("ddp", runs["none"]))
    print(memory_row("fsdp", runs["fsdp"]))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=60, help="Optimizer steps per epoch.")
    parser.add_argument("--epochs", type=int, default=3, help="Epochs; loss: the last one's.")
    parser.add_argument(
        "--warmup-fraction",
        type=float,
        default=0.1,
        help="PowerSGD / post-local SGD plain steps, as a share of all steps.",
    )
    parser.add_argument(
        "--label-noise",
        type=float,
        default=0.2,
        help="Share of rows with a random label (a loss floor, as real data).",
    )
    parser.add_argument(
        "--signal",
        type=float,
        default=0.1,
        help="Share of positions holding class tokens (lower: harder task).",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        default=[*DDP_RUNS, "fsdp"],
        help="Runs to make (default: all); the report needs all.",
    )
    parser.add_argument("--out", default=None, help="Work directory (default: a temp dir).")
    parser.add_argument(
        "--optimizer",
        default=OPTIMIZER,
        help="NAME:LR for every run, NAME adamw or sgd (Nesterov momentum 0.9, "
        "the setting PowerSGD was designed for).",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dataset", help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--names", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.dataset, args.out, args.names, args.warmup, args.epochs, args.optimizer)
        return
    out = args.out or tempfile.mkdtemp(prefix="comm-bench-")
    spec = TokenDatasetSpec(
        num_rows=args.steps * BATCH_SIZE * WORLD_SIZE,
        holdout_rows=512,
        rows_per_shard=2048,
        rows_per_row_group=256,
        signal=args.signal,
        label_noise=args.label_noise,
    )
    dataset = write_token_dataset(f"{out}/tokens", spec)
    warmup = max(2, int(args.epochs * args.steps * args.warmup_fraction))
    ddp = [name for name in DDP_RUNS if name in args.only]
    for names in (ddp, ["fsdp"] if "fsdp" in args.only else []):
        if names:
            launch(dataset, f"{out}/runs", names, warmup, args.epochs, args.optimizer)
    runs = {
        p.parent.name: json.loads(p.read_text()) for p in Path(f"{out}/runs").glob("*/summary.json")
    }
    if set(runs) >= set(DDP_RUNS) | {"fsdp"}:
        report(runs, warmup)
    else:
        print(json.dumps({name: run["train_loss"] for name, run in runs.items()}))


if __name__ == "__main__":
    main()
