"""One training rank: `python -m training --config FILE.yaml [--resume] [--ckpt-path PATH]`.

A launcher (training/launch/) starts it once per rank under torchrun, whether on
this machine, on several nodes, through srun or in a PyTorchJob's pods; under
torchrun Lightning finds TorchElasticEnvironment and spawns nothing
(docs/architecture.md M1). Run without a launcher it trains in one process.
`--resume` continues from `last.ckpt` in the checkpoint directory when there is
one (what a retry passes). Rank 0 writes `<output_dir>/summary.json`, with the sha256
of the config file it ran. The config
may be any fsspec URI.

A config or data error (training/launch/failures.py) ends the rank with status 2,
its cause in one line on stderr and its traceback in `<output_dir>/errors/`, so
that the launcher does not retry it. After a successful run the process groups
are destroyed and the process ends without interpreter shutdown, where
torch.distributed sometimes aborts ("terminate called without an active
exception") after the work is done (`training.train.exit_rank`).
"""

from __future__ import annotations

import argparse

from training.config import config_sha256, load_train_config
from training.launch.failures import is_config_error, report_config_error
from training.train import close_process_group, exit_rank, run_training


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file (or URI) of a TrainConfig.")
    parser.add_argument("--ckpt-path", default=None, help='Resume from a checkpoint, or "last".')
    parser.add_argument(
        "--resume", action="store_true", help="Resume from last.ckpt when there is one."
    )
    args = parser.parse_args(argv)
    output_dir = None
    try:
        cfg = load_train_config(args.config)
        output_dir = cfg.output_dir
        run_training(
            cfg,
            ckpt_path=args.ckpt_path,
            resume=args.resume,
            config_sha256=config_sha256(args.config),
        )
    except BaseException as error:
        close_process_group(wait_for_peers=False)
        if not is_config_error(error):
            raise
        return report_config_error(error, output_dir)
    return 0


if __name__ == "__main__":
    exit_rank(main())
