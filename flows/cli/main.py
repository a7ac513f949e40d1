"""The `ballast` command line.

    ballast demo                                   generate a sample, run the whole pipeline
    ballast run pipeline --config demo --output json   the full result (default: a table)
    ballast run pipeline --config nightly --work-dir /data --set train.max_epochs=1
    ballast serve --work-dir /data                 serve the scheduled deployments (no pool)
    ballast deployments > infra/prefect.yaml       the same deployments for `prefect deploy`
    ballast status --config nightly --work-dir /data   newest versions and the champion
    ballast init --inputs /data/raw [--label COL] > pipeline.yaml   a starter config
    ballast inspect /data/datasets                 a version's classes, shards, null policies
    ballast rollback --model NAME [--to VERSION] --tracking-uri URI   champion back
    ballast rollback --dataset /data/datasets --to VERSION_ID         _CURRENT back
    ballast files /data/datasets [--split train] [--version ID]       a version's shard URIs

A command that fails ends with its cause on one line and the path of a log file that
holds the traceback (printed too with `-v`), then the fix on a line of its own when the
error carries one apart from its message. Its exit status is that of
`python -m preprocessing`: 2 for a config
or data error, 3 when another run moved a dataset's `_CURRENT` meanwhile, 4 for storage or
a service that may answer later, 5 for storage that refuses (no space, permission, a
read-only file system, a missing bucket), 1 for anything else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from pydantic_core import to_jsonable_python

from flows.cli.files import add_files_command
from flows.overrides import apply_override as apply_override  # the CLI's, tested here
from flows.presets import PRESETS_DIR  # no config model imported before `--help` answers
from preprocessing.toolbox.secrets import redact

FLOW_NAMES = ("pipeline", "reshard", "train", "evaluate", "batch_inference")


def presets_help() -> str:
    """The shipped presets, each with the first line of its header comment."""
    lines = ["presets (--config NAME; or give any YAML file):"]
    for path in sorted(PRESETS_DIR.glob("*.yaml")):
        header = next((line for line in path.read_text().splitlines() if line.startswith("#")), "#")
        lines.append(f"  {path.stem:<16} {header.lstrip('# ').rstrip(' :->')}")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ballast", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="generate a skewed sample and run the pipeline")
    demo.add_argument("--work-dir", default="demo-output", help="where everything is written")
    demo.add_argument("--rows", type=int, default=120_000, help="rows of generated raw data")
    _output_arguments(demo)
    run = commands.add_parser(
        "run",
        help="run a flow ad hoc from a YAML config or preset",
        epilog=presets_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    run.add_argument("flow", choices=FLOW_NAMES, help="the flow to run")
    _config_arguments(run)
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, e.g. --set train.max_epochs=1",
    )
    run.add_argument(
        "--force",
        action="store_true",
        help="pipeline: promote even when the "
        "champion cannot read the new rows or the data drifted past a threshold",
    )
    _output_arguments(run)
    serve = commands.add_parser("serve", help="serve the deployments with their schedules")
    serve.add_argument("--work-dir", default=".", help="fills ${WORK_DIR} in the presets")
    deployments = commands.add_parser("deployments", help="print infra/prefect.yaml")
    deployments.add_argument(
        "--work-dir",
        help="fills ${WORK_DIR} in the presets (default: "
        "kept, for each flow run to fill from $BALLAST_WORK_DIR)",
    )
    status = commands.add_parser("status", help="newest dataset versions and the champion")
    _config_arguments(status)
    status.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one field, as `ballast run --set` does",
    )
    init = commands.add_parser("init", help="print a starter pipeline config for your files")
    init.add_argument("--inputs", required=True, help="directory, file or glob of raw files")
    init.add_argument("--label", help="the label column (default: label, target, class, y)")
    inspect = commands.add_parser("inspect", help="what a committed dataset version holds")
    inspect.add_argument("dataset", help="a manifest, version directory or output root")
    _rollback_arguments(
        commands.add_parser("rollback", help="move the champion alias or a dataset's _CURRENT back")
    )
    add_files_command(commands)
    verify = commands.add_parser(
        "verify",
        help="check a version and its chain (shards, lineage, groups and duplicates on one "
        "side of the split, each night's time cut); exit 1 if anything is damaged or leaks",
    )
    verify.add_argument("root", help="the output root of the dataset")
    verify.add_argument("--version", help="the version to check (default: _CURRENT's)")
    verify.add_argument(
        "--deep", action="store_true", help="also decode every page, verifying its checksum"
    )
    return parser


def _rollback_arguments(rollback: argparse.ArgumentParser) -> None:
    which = rollback.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="registered model whose `champion` alias moves back")
    which.add_argument("--dataset", help="output root whose `_CURRENT` moves back")
    rollback.add_argument(
        "--to",
        help="model version (default: the previous champion) or "
        "dataset version id (required with --dataset)",
    )
    rollback.add_argument(
        "--tracking-uri",
        default=os.environ.get("MLFLOW_TRACKING_URI"),
        help="with --model (default: $MLFLOW_TRACKING_URI)",
    )
    rollback.add_argument(
        "--reason",
        default="rolled back by `ballast rollback`",
        help="why, recorded as a tag on the model",
    )


def _config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, help="YAML file, or the name of a preset")
    parser.add_argument("--work-dir", default=".", help="fills ${WORK_DIR} in the config")


def _output_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output",
        choices=("table", "json"),
        default="table",
        help="the result as a short table (default) or in full as JSON",
    )
    parser.add_argument(
        "--result-file", metavar="PATH", help="also write the full result as JSON to this file"
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="libraries' INFO lines (Dask, Prefect, MLflow) on the console "
        "too; they are always in the command's log file",
    )


def _run(args: argparse.Namespace) -> str:
    from preprocessing.storage.reach import check_reachable

    check_reachable([args.config])  # a config on S3 fails as its inputs and output would
    from flows.cli.values import resolved_values

    values, tracking_lines = resolved_values(args.config, args.work_dir, args.set)
    check_reachable(s3_uris(values))  # inputs, output...: before Prefect is even imported
    from flows.api_outage import unsent_work_dropped_when_api_down
    from flows.deployments import FLOWS
    from flows.params import parse_params
    from flows.temporary_server import start_temporary_server

    if args.force:
        if args.flow != "pipeline":
            raise ValueError(f"--force applies to the pipeline flow, not {args.flow}")
        values.setdefault("promotion", {})["force"] = True
    flow, params_type = FLOWS[args.flow]
    overridden = ", ".join(f"--set {a.partition('=')[0]}" for a in args.set)
    origin = f"{args.config} with {overridden}" if overridden else args.config
    params = parse_params(params_type, values, origin)
    with _quiet(args):
        start_temporary_server()
        # Which tracking server, and why (README: With MLflow); said once the run can start,
        # so a command that fails before (no Prefect server) prints only its one line.
        for line in tracking_lines:
            print(line, file=sys.stderr)
        with unsent_work_dropped_when_api_down():
            result = flow(**params.arguments())
    return _output(args, result, lambda: _summary(params, result))


def s3_uris(values: object) -> list[str]:
    """Every S3 URI among a run's settings (inputs, output root, checkpoints...)."""
    if isinstance(values, dict):
        return [uri for value in values.values() for uri in s3_uris(value)]
    if isinstance(values, list):
        return [uri for value in values for uri in s3_uris(value)]
    return [values] if isinstance(values, str) and values.startswith(("s3://", "s3a://")) else []


def _summary(params: Any, result: object) -> str:
    """The console summary of a finished run. Imported only here: its modules (MLflow,
    torch) take 5 s to import on a quiet 2-core machine, which a refused run, or one that
    fails before its end, does not pay before printing its cause."""
    from flows.cli.summary import format_result

    return format_result(params, result)


def _demo(args: argparse.Namespace) -> str:
    from flows.api_outage import unsent_work_dropped_when_api_down
    from flows.cli.demo import demo_summary, run_demo
    from flows.temporary_server import start_temporary_server

    with _quiet(args):
        start_temporary_server()
        with unsent_work_dropped_when_api_down():
            params, result, seconds = run_demo(args.work_dir, num_rows=args.rows)
    return _output(args, result, lambda: demo_summary(params, result, seconds))


@contextmanager
def _quiet(args: argparse.Namespace) -> Iterator[None]:
    """The command's logging (flows/cli/console.py): everything into its log file, the console
    quiet unless `-v`. Entered once the flows are imported: libraries set up their
    console handlers at import, and those are the ones made quiet."""
    from flows.cli.console import command_logging
    from tracking.console import quiet_mlflow_events

    with command_logging(args.log_path, args.verbose, stay_quiet=True), ExitStack() as stack:
        if not args.verbose:
            stack.enter_context(quiet_mlflow_events())
        yield


def _output(args: argparse.Namespace, result: Any, table: Callable[[], str]) -> str:
    """The result as JSON or as `table()` (then with where the full result is), written
    to `--result-file` too when given; the log file's path last."""
    full = json.dumps(to_jsonable_python(result, fallback=str), indent=1)
    if args.result_file:
        Path(args.result_file).write_text(full + "\n")
    if args.output == "json":
        return full
    where = args.result_file or "--output json"
    return f"{table()}\nfull result: {where}; log: {args.log_path}"


def _dispatch(args: argparse.Namespace) -> str | None:
    if args.command == "demo":
        return _demo(args)
    if args.command == "run":
        return _run(args)
    if args.command == "deployments":
        from flows.deployments import render_prefect_yaml

        return render_prefect_yaml(args.work_dir)
    if args.command == "status":
        from flows.cli.status import describe_status

        return describe_status(args.config, args.work_dir, args.set)
    if args.command == "rollback":
        from flows.cli.rollback import rollback

        return rollback(args.model, args.dataset, args.to, args.tracking_uri, args.reason)
    if args.command == "files":
        from flows.cli.files import list_files

        return list_files(args.root, args.split, args.version)
    if args.command in ("init", "inspect"):
        from flows.cli.dataset import describe_version
        from flows.cli.init_config import describe_inputs

        if args.command == "init":
            return describe_inputs(args.inputs, args.label)
        return describe_version(args.dataset)
    from flows.serving import serve_deployments

    return serve_deployments(args.work_dir)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Ballast runs on machines without internet: Prefect's server would report failed pings.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if args.command in ("demo", "run"):
        from flows.cli.console import new_log_path

        args.log_path = new_log_path(args.command)
    try:
        if args.command == "verify":  # the one command whose exit status is its answer
            return _verify(args)
        output = _dispatch(args)
    except Exception as error:
        report_error(args, error)
        return failure_status(error)
    if output:
        print(redact(output), end="" if output.endswith("\n") else "\n")
    return 0


def _verify(args: argparse.Namespace) -> int:
    """Print `ballast verify`'s report; 0 when the chain is whole, no group or duplicate
    content crosses splits and no row lies across its night's time cut, 1 otherwise."""
    from preprocessing.contract.verify import verify_chain
    from preprocessing.storage.reach import check_reachable
    from preprocessing.versions.split_leaks import split_leaks

    check_reachable([args.root])  # a dead endpoint or a missing bucket: 4 or 5, not 1
    report = verify_chain(args.root, args.version, deep=args.deep)
    leaks = split_leaks(args.root, args.version) if report.whole else []
    print(redact("\n".join([report.text(), *(leak.line() for leak in leaks)])))
    return 0 if report.whole and not leaks else 1


def report_error(args: argparse.Namespace, error: BaseException) -> None:
    """The cause on one line with the log file that holds the traceback, the traceback
    itself with `-v`, and the fix when one is known."""
    log = write_error_log(args.command, error, getattr(args, "log_path", None))
    if getattr(args, "verbose", False):
        traceback.print_exception(error, file=sys.stderr)
    lines = [f"ballast {args.command}: {one_line(error)} (traceback: {log})"]
    fix = fix_for(error)
    if fix is not None:
        lines.append(f"  fix: {fix}")
    print(redact("\n".join(lines)), file=sys.stderr)


def fix_for(error: BaseException) -> str | None:
    """What to do about `error` when the error carries it apart from its message (`fix`);
    ballast's own errors mostly say it in their message (the temporary Prefect server's
    failure: flows/temporary_server.py)."""
    fix = getattr(error, "fix", None)
    return str(fix) if fix else None


def failure_status(error: BaseException) -> int:
    """The documented exit status of a failed command (preprocessing/contract/
    exit_status.py: bad input 2, conflict 3, transient 4, storage refused 5, else 1); a
    training job that stopped exits 2 when it stopped on a config or data error, else 1."""
    from preprocessing.contract.exit_status import BAD_INPUT, INTERNAL, exit_status
    from training.launch.failures import TrainingFailed

    if isinstance(error, TrainingFailed):
        return BAD_INPUT if error.config_error is not None else INTERNAL
    return exit_status(error)


def one_line(error: BaseException, max_chars: int = 600) -> str:
    """The cause on one line: each invalid field with its message (no documentation
    links), or the error's message up to a launcher's output tail."""
    if isinstance(error, ValidationError):
        text = f"invalid {error.title} ({error.error_count()} problem(s)): " + "; ".join(
            field_problem(problem) for problem in error.errors(include_url=False)
        )
    else:
        message = str(error).split("\n--- last output ---", 1)[0]
        text = " ".join(line.strip() for line in message.splitlines() if line.strip())
        text = text or type(error).__name__
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def field_problem(problem: Any) -> str:
    """`field.path: message (got value)`, the value shown when it is a scalar."""
    field = ".".join(str(part) for part in problem["loc"]) or "(top level)"
    value = problem.get("input")
    shown = f" (got {value!r})" if isinstance(value, str | int | float | bool) else ""
    return f"{field}: {problem['msg']}{shown}"


def write_error_log(command: str, error: BaseException, path: Path | None = None) -> Path:
    """The full traceback at the end of the command's log file `path`, or in a new file
    under $BALLAST_LOG_DIR (default: a `ballast` directory in the system's temporary
    directory); its path."""
    from flows.cli.console import new_log_path

    path = path or new_log_path(command)
    with path.open("a") as log:
        log.write(redact("".join(traceback.format_exception(error))))
    return path


if __name__ == "__main__":
    sys.exit(main())
