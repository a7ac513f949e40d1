"""`python -m preprocessing --config FILE.yaml`: one reshard, without Prefect.

By default on a local cluster of the config's `num_workers` processes; `--scheduler
ADDRESS` joins an existing Dask scheduler, `--dask FILE.yaml` takes any `DaskConfig`.

`--compact` reshards every input into one flat version whatever the config's `mode`
(the compaction of a chain of incremental versions: preprocessing/versions/incremental.py).

Exit status: 0 when the version is committed (by this run, or found committed: then
it prints `already committed`), 2 for bad input (config, inputs, a hostile or broken
manifest, changed inputs an incremental run refuses), 3 when another run moved
`_CURRENT` during this one (a flat version is written: rerun to make it current if it
is the newer one; a chain's child is withdrawn: rerun to append to the new current), 4
when input files could not be read for a reason that may pass (S3 503, resets, ...:
nothing is committed; rerun).
"""

from __future__ import annotations

import argparse
import sys

from pydantic import ValidationError

from preprocessing.config import ReshardConfig
from preprocessing.contract.config_files import ConfigFileError, load_config
from preprocessing.contract.manifest import CommitConflict, ManifestError
from preprocessing.contract.secrets import redact
from preprocessing.driver.cluster import DaskConfig, StorageNotShared
from preprocessing.driver.reshard import InputsUnreadable, TooManyRejected, run_reshard
from preprocessing.versions.incremental import InputsChanged


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m preprocessing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML file of a ReshardConfig")
    parser.add_argument("--compact", action="store_true",
                        help="a full reshard into one flat version (mode: full)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", help="address of a running Dask scheduler")
    where.add_argument("--dask", help="YAML file of a DaskConfig (kind, address, options)")
    args = parser.parse_args(argv)
    try:
        executor = _executor(args)
    except (ValidationError, ConfigFileError, FileNotFoundError) as error:
        return _fail(args.dask or "--scheduler", error)
    try:
        config = load_config(ReshardConfig, args.config)
        if args.compact:
            config = config.model_copy(update={"mode": "full"})
        result = run_reshard(config, executor)
    except (ValidationError, ConfigFileError, FileNotFoundError, TooManyRejected, StorageNotShared,
            ManifestError, InputsChanged) as error:
        return _fail(args.config, error)
    except CommitConflict as error:
        return _fail(args.config, error, status=3)
    except InputsUnreadable as error:
        return _fail(args.config, error, status=4)
    state = "already committed" if result.reused else "committed"
    print(f"{state}: {redact(result.manifest_uri)} ({result.how})")
    return 0


def _fail(source: str, error: Exception, status: int = 2) -> int:
    print(redact(f"{source}: {error}"), file=sys.stderr)
    return status


def _executor(args: argparse.Namespace) -> DaskConfig | None:
    """The cluster named on the command line; None for the config's local cluster."""
    if args.scheduler:
        return DaskConfig(kind="address", address=args.scheduler)
    if args.dask:
        return load_config(DaskConfig, args.dask)
    return None


if __name__ == "__main__":
    sys.exit(main())
