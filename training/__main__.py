"""One training rank: `python -m training --config FILE.yaml [--ckpt-path last]`.

torchrun starts it once per rank (training/launch.py), as do srun and a
Kubernetes PyTorchJob; under torchrun Lightning finds TorchElasticEnvironment
and spawns nothing (shared/FINDINGS.md 1). Run without a launcher it trains in
one process. Rank 0 writes `<output_dir>/summary.json`.
"""

from __future__ import annotations

import argparse

from training.config import load_train_config
from training.train import run_training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file of a TrainConfig.")
    parser.add_argument("--ckpt-path", default=None, help='Resume from a checkpoint, or "last".')
    args = parser.parse_args(argv)
    run_training(load_train_config(args.config), ckpt_path=args.ckpt_path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
