"""`python -m tracking upload <dir>...`: send runs kept on local disk while MLflow was down.

Each directory is one run's spool (tracking/run/spool.py; its path is in the warning that
kept it). Everything in it is sent once, in order; a repeated upload sends nothing twice.
The tracking URI is stored without its password: pass `--tracking-uri` when it had one.
"""

from __future__ import annotations

import argparse
import sys

from tracking.run.runs import deliver, how_to_open
from tracking.run.spool import Spool


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tracking")
    commands = parser.add_subparsers(dest="command", required=True)
    upload = commands.add_parser("upload", help="send runs kept while MLflow was down")
    upload.add_argument("spools", nargs="+", metavar="DIR", help="a run's spool directory")
    upload.add_argument(
        "--tracking-uri",
        default=None,
        help="send there instead of the stored URI (needed when it had a "
        "password, which is never stored)",
    )
    upload.add_argument(
        "--wait-s",
        type=float,
        default=60.0,
        help="how long to wait for a server that cannot be reached",
    )
    return parser.parse_args(argv)


def upload(directory: str, tracking_uri: str | None, wait_s: float) -> bool:
    """Deliver one spool; prints the outcome. False when something is still kept."""
    spool = Spool(directory)
    if not spool.exists():
        print(f"{directory}: not a run spool (no run.json)", file=sys.stderr)
        return False
    config = spool.tracking_config(tracking_uri)
    if "***" in config.tracking_uri:
        print(
            f"{directory}: the stored tracking URI {config.tracking_uri} had a password; "
            "pass --tracking-uri",
            file=sys.stderr,
        )
        return False
    run_id = deliver(spool, config.model_copy(update={"delivery_wait_s": wait_s}))
    if run_id is None:
        print(f"{directory}: not sent (see the warning above); nothing was lost", file=sys.stderr)
        return False
    print(f"{directory}: sent as run {run_id}; {how_to_open(config.tracking_uri, run_id)}")
    return True


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    results = [upload(directory, args.tracking_uri, args.wait_s) for directory in args.spools]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
