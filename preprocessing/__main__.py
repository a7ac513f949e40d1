"""`python -m preprocessing --config FILE.yaml`: one reshard, without Prefect.

Exit status: 0 when the version is committed (by this run, or found committed: then
it prints `already committed`), 2 for bad input (config, inputs, a hostile or broken
manifest), 3 when another run moved `_CURRENT` during this one (the version is
written; rerun to make it current if it is the newer one).
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from preprocessing.config import load_reshard_config
from preprocessing.manifest import CommitConflict, ManifestError
from preprocessing.reshard import TooManyRejected, run_reshard


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m preprocessing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML file of a ReshardConfig")
    args = parser.parse_args()
    try:
        result = run_reshard(load_reshard_config(args.config))
    except (ValidationError, FileNotFoundError, TooManyRejected, ManifestError) as error:
        print(f"{args.config}: {error}", file=sys.stderr)
        return 2
    except CommitConflict as error:
        print(f"{args.config}: {error}", file=sys.stderr)
        return 3
    state = "already committed" if result.reused else "committed"
    print(f"{state}: {result.manifest_uri}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
