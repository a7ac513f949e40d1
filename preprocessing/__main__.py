"""`python -m preprocessing --config FILE.yaml`: one reshard, without Prefect.

By default on a local cluster of the config's `num_workers` processes; `--scheduler
ADDRESS` joins an existing Dask scheduler, `--dask FILE.yaml` takes any `DaskConfig`.

`--compact` reshards every input into one flat version whatever the config's `mode`
(the compaction of a chain of incremental versions: preprocessing/versions/incremental.py).

Exit status (preprocessing/contract/exit_status.py): 0 when the version is committed (by
this run, or found committed: then it prints `already committed`); 2 for bad input
(config, flags, inputs, a hostile or broken manifest, changed inputs an incremental run
refuses, an output root inside an input root); 3 when another run moved `_CURRENT`
during this one (a flat version is written: rerun to make it current if it is the newer
one; a chain's child is withdrawn: rerun to append to the new current); 4 when storage
failed for a reason that may pass (S3 503, resets, an endpoint that does not answer:
nothing is committed; rerun); 5 when storage refused for a reason only a person fixes
(no space, quota, permission, a read-only file system, a missing bucket); 1 for anything
else (a bug). A failure prints one line naming the file, field or bucket, and where its
traceback is.
"""

from __future__ import annotations

import argparse
import sys

from preprocessing.config import ReshardConfig
from preprocessing.contract.exit_status import cause_line, exit_status, write_traceback
from preprocessing.driver.cluster import DaskConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.storage.reach import check_reachable
from preprocessing.toolbox.config_files import load_config
from preprocessing.toolbox.secrets import redact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m preprocessing",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--config", required=True, help="YAML file of a ReshardConfig")
    parser.add_argument(
        "--compact", action="store_true", help="a full reshard into one flat version (mode: full)"
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--scheduler", help="address of a running Dask scheduler")
    where.add_argument("--dask", help="YAML file of a DaskConfig (kind, address, options)")
    args = parser.parse_args(argv)
    try:
        executor = _executor(args)
    except Exception as error:
        return _fail(args.dask or "--scheduler", error)
    try:
        check_reachable([args.config])  # a config on S3 fails as its inputs would
        config = load_config(ReshardConfig, args.config)
        if args.compact:
            config = config.model_copy(update={"mode": "full"})
        result = run_reshard(config, executor)
    except Exception as error:
        return _fail(args.config, error)
    if result.resumed:  # on stderr: stdout is the one line callers parse
        print(result.resumed, file=sys.stderr)
    state = "already committed" if result.reused else "committed"
    print(f"{state}: {redact(result.manifest_uri)} ({result.how})")
    return 0


def _fail(source: str, error: Exception) -> int:
    """Print the cause on one line naming `source`, the traceback to a log file; the
    documented status."""
    log = write_traceback("preprocessing", error)
    print(redact(f"{source}: {cause_line(error)} (traceback: {log})"), file=sys.stderr)
    return exit_status(error)


def _executor(args: argparse.Namespace) -> DaskConfig | None:
    """The cluster named on the command line; None for the config's local cluster."""
    if args.scheduler:
        return DaskConfig(kind="address", address=args.scheduler)
    if args.dask:
        check_reachable([args.dask])
        return load_config(DaskConfig, args.dask)
    return None


if __name__ == "__main__":
    sys.exit(main())
