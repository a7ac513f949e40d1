"""`python -m training.launch render|launch --config URI [--kind slurm --num-nodes 2 ...]`.

`render` prints what would start one attempt (a torchrun line, an sbatch script, or a
ConfigMap and a PyTorchJob) for the config as given; `launch` runs the job through
`run_job` (pinned, retried, resumed), closes its MLflow run FINISHED and prints its
summary as JSON. Every field of every kind of job is a flag (`--num-processes-per-node`,
`--attempts`, `--first-delay-s`, `--sbatch-options "--exclusive --reservation=ml"`); a
flag the chosen `--kind` has no field for is refused.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from preprocessing.toolbox.faults import RetryPolicy
from training.config import TrainConfig, load_train_config
from training.launch.config import JOB_KINDS, AnyJob, parse_launch
from training.launch.failures import CONFIG_ERROR_STATUS, TrainingFailed
from training.launch.job import make_launcher, run_job

PROG = "python -m training.launch"
NESTED = {"retry": RetryPolicy}
SKIPPED = {"env", "kind", *NESTED}
PARSERS: dict[Any, Callable[[str], Any]] = {int: int, float: float, list[str]: shlex.split}


def add_field_flags(
    parser: argparse.ArgumentParser, model: type[BaseModel], skipped: set[str]
) -> None:
    """One flag per scalar field (once, for a field of several kinds); left out, the
    field keeps its default."""
    for name, field in model.model_fields.items():
        if name not in skipped:
            skipped.add(name)
            parse = PARSERS.get(field.annotation, str)
            default = field.get_default(call_default_factory=True)
            parser.add_argument(
                f"--{name.replace('_', '-')}",
                dest=name,
                type=parse,
                # argparse expands %-formats in help: sbatch's `%x-%j.out` must stay text
                help=f"{field.description} (default: {default})".replace("%", "%%"),
            )


def parse_spec(argv: list[str] | None) -> tuple[str, str, bool, AnyJob]:
    """(action, config URI, resume, the LaunchConfig the flags describe)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("action", choices=["render", "launch"])
    parser.add_argument("--config", required=True, help="The job's TrainConfig (path or URI).")
    parser.add_argument("--resume", action="store_true", help="Resume from the last checkpoint.")
    parser.add_argument(
        "--kind",
        choices=list(JOB_KINDS),
        help="Where the job runs (default: local); each kind takes only its own flags.",
    )
    shown = set(SKIPPED)
    for kind in JOB_KINDS.values():
        add_field_flags(parser, kind, shown)
    for nested in NESTED.values():
        add_field_flags(parser, nested, set())
    args = {key: value for key, value in vars(parser.parse_args(argv)).items() if value is not None}
    action, config, resume = args.pop("action"), args.pop("config"), args.pop("resume")
    fields: dict[str, Any] = {
        name: values
        for name, model in NESTED.items()
        if (values := {key: args.pop(key) for key in list(args) if key in model.model_fields})
    }
    return action, config, resume, parse_launch(fields | args)


def close_job_run(cfg: TrainConfig, summary: dict[str, Any]) -> None:
    """Close the job's MLflow run FINISHED with its summary and checkpoints, as a flow's
    `close_run` does (a failed job's run is closed FAILED by `run_job`)."""
    if cfg.tracking is None or not summary.get("run_id"):
        return
    from preprocessing.contract.manifest import read_manifest
    from tracking.run.runs import finish_run

    manifest, _ = read_manifest(summary["manifest_uri"])
    checkpoints = summary.get("checkpoint_uri") or cfg.checkpoint_uri  # the run's own
    finish_run(cfg.tracking, summary["run_id"], summary, manifest, checkpoints)


def main(argv: list[str] | None = None) -> int:
    try:
        action, config, resume, spec = parse_spec(argv)
        if action == "render":
            print(make_launcher(spec).render(config, resume), end="")
            return 0
        cfg = load_train_config(config)
        summary = run_job(cfg.model_copy(update={"resume": cfg.resume or resume}), spec)
        close_job_run(cfg, summary)
    except (ValidationError, ValueError) as error:
        print(f"{PROG}: {' '.join(str(error).split())}", file=sys.stderr)
        return CONFIG_ERROR_STATUS
    except TrainingFailed as failure:
        print(f"{PROG}: {failure}", file=sys.stderr)
        return CONFIG_ERROR_STATUS if failure.config_error else 1
    print(json.dumps(summary, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
