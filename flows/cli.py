"""The `ballast` command line: `ballast demo`, `ballast run pipeline --config FILE`."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ballast", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="generate a skewed sample and run the pipeline")
    demo.add_argument("--work-dir", default="demo-output", help="where everything is written")
    demo.add_argument("--rows", type=int, default=120_000, help="rows of generated raw data")
    run = commands.add_parser("run", help="run a flow ad hoc from a YAML config or preset")
    run.add_argument("flow", choices=["pipeline"], help="the flow to run")
    run.add_argument("--config", required=True, help="YAML file, or the name of a preset")
    run.add_argument("--work-dir", default=".", help="fills ${WORK_DIR} in the config")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one field, e.g. --set train.max_epochs=1")
    return parser


def apply_override(values: dict[str, Any], assignment: str) -> None:
    """Set a dotted key (`train.loader.batch_size=128`); the value is parsed as YAML."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key:
        raise ValueError(f"--set {assignment!r}: expected KEY=VALUE")
    *parents, leaf = key.split(".")
    node = values
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = yaml.safe_load(raw)


def _run(args: argparse.Namespace) -> str:
    from flows.params import PipelineParams, load_preset
    from flows.pipeline import pipeline

    values = load_preset(args.config, args.work_dir)
    for assignment in args.set:
        apply_override(values, assignment)
    return str(pipeline(PipelineParams.model_validate(values)))


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Ballast runs on machines without internet: Prefect's server would report failed pings.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        if args.command == "demo":
            from flows.demo import run_demo

            print(run_demo(args.work_dir, num_rows=args.rows))
        else:
            print(_run(args))
    except (ValidationError, FileNotFoundError, ValueError) as error:
        print(f"ballast {args.command}: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
