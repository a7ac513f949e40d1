"""One training rank: `python -m training --config FILE.yaml [--resume] [--ckpt-path PATH]`.

torchrun starts it once per rank (training/launch.py), as do srun and a
Kubernetes PyTorchJob (training/launchers.py); under torchrun Lightning finds
TorchElasticEnvironment and spawns nothing (docs/architecture.md M1). Run without
a launcher it trains in one process. `--resume` continues from `last.ckpt` in
the checkpoint directory when there is one (what a job-level retry passes).
Rank 0 writes `<output_dir>/summary.json`. The config may be any fsspec URI. After
a successful run the process groups are destroyed and the process ends without
interpreter shutdown, where torch.distributed sometimes aborts ("terminate called
without an active exception") after the work is done (`training.train.exit_rank`).
"""

from __future__ import annotations

import argparse

from training.config import load_train_config
from training.train import close_process_group, exit_rank, run_training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file (or URI) of a TrainConfig.")
    parser.add_argument("--ckpt-path", default=None, help='Resume from a checkpoint, or "last".')
    parser.add_argument(
        "--resume", action="store_true", help="Resume from last.ckpt when there is one."
    )
    args = parser.parse_args(argv)
    cfg = load_train_config(args.config)
    if args.resume:
        cfg = cfg.model_copy(update={"resume": True})
    try:
        run_training(cfg, ckpt_path=args.ckpt_path)
    except BaseException:
        close_process_group(wait_for_peers=False)
        raise
    return 0


if __name__ == "__main__":
    exit_rank(main())
