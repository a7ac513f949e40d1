"""The `ballast` command line.

    ballast demo                                   generate a sample, run the whole pipeline
    ballast run pipeline --config nightly --work-dir /data --set train.max_epochs=1
    ballast serve --work-dir /data                 serve the scheduled deployments (no pool)
    ballast deployments > infra/prefect.yaml       the same deployments for `prefect deploy`
    ballast status --config nightly --work-dir /data   newest versions and the champion
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import yaml
from pydantic import ValidationError

from preprocessing.secrets import redact

FLOW_NAMES = ("pipeline", "reshard", "train", "evaluate", "batch_inference")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ballast", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="generate a skewed sample and run the pipeline")
    demo.add_argument("--work-dir", default="demo-output", help="where everything is written")
    demo.add_argument("--rows", type=int, default=120_000, help="rows of generated raw data")
    run = commands.add_parser("run", help="run a flow ad hoc from a YAML config or preset")
    run.add_argument("flow", choices=FLOW_NAMES, help="the flow to run")
    _config_arguments(run)
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="override one field, e.g. --set train.max_epochs=1")
    serve = commands.add_parser("serve", help="serve the deployments with their schedules")
    serve.add_argument("--work-dir", default=".", help="fills ${WORK_DIR} in the presets")
    deployments = commands.add_parser("deployments", help="print infra/prefect.yaml")
    deployments.add_argument("--work-dir", default="/var/lib/ballast",
                             help="fills ${WORK_DIR} in the presets")
    status = commands.add_parser("status", help="newest dataset versions and the champion")
    _config_arguments(status)
    return parser


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file, or the name of a preset")
    parser.add_argument("--work-dir", default=".", help="fills ${WORK_DIR} in the config")


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
    from flows.deployments import FLOWS
    from flows.params import load_preset

    values = load_preset(args.config, args.work_dir)
    for assignment in args.set:
        apply_override(values, assignment)
    flow, params_type = FLOWS[args.flow]
    return yaml.safe_dump(flow(params_type.model_validate(values)), sort_keys=False)


def _dispatch(args: argparse.Namespace) -> str | None:
    if args.command == "demo":
        from flows.demo import run_demo

        return run_demo(args.work_dir, num_rows=args.rows)
    if args.command == "run":
        return _run(args)
    if args.command == "deployments":
        from flows.deployments import render_prefect_yaml

        return render_prefect_yaml(args.work_dir)
    if args.command == "status":
        from flows.status import describe_status

        return describe_status(args.config, args.work_dir)
    from prefect import serve

    from flows.deployments import build_deployments

    serve(*build_deployments(args.work_dir))
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Ballast runs on machines without internet: Prefect's server would report failed pings.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    try:
        output = _dispatch(args)
    except (ValidationError, FileNotFoundError, ValueError) as error:
        print(redact(f"ballast {args.command}: {error}"), file=sys.stderr)
        return 2
    if output:
        print(redact(output), end="" if output.endswith("\n") else "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
