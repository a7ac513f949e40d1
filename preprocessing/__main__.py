"""`python -m preprocessing --config FILE.yaml`: one reshard, without Prefect."""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from preprocessing.config import load_reshard_config
from preprocessing.reshard import TooManyRejected, run_reshard


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m preprocessing", description=__doc__)
    parser.add_argument("--config", required=True, help="YAML file of a ReshardConfig")
    args = parser.parse_args()
    try:
        result = run_reshard(load_reshard_config(args.config))
    except (ValidationError, FileNotFoundError, TooManyRejected) as error:
        print(f"{args.config}: {error}", file=sys.stderr)
        return 2
    state = "already committed" if result.reused else "committed"
    print(f"{state}: {result.manifest_uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
