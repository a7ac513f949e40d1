"""Who and what made a run, in MLflow's own terms, so its UI shows them: the experiment's
kind, each run's Source, Created by and source version (`mlflow.source.name`,
`mlflow.source.type`, `mlflow.user`, `mlflow.source.git.commit`) and parent
(`mlflow.parentRunId`), and the links that open a run in the UI's training view.

The experiment's kind (`mlflow.experimentKind`) is MLflow's record of what an experiment
is for, the tag its own kind selector sets. MLflow 3.17.2's UI does not choose its mode
by it, though: it takes the `workflowType` of the page's address, else the mode this
browser chose last (GenAI on a first visit), its lookup of the kind switched off in its
build (benchmarks/RESULTS.md M61). So the links ballast writes carry `TRAINING_VIEW`.

The flows name the source (`ballast run pipeline`, or a deployment's name and, as the
user, the deployment for a scheduled run); a job started by hand gets its own command
line and the OS user. The commit stays in `git_sha` too, where earlier releases kept it.
"""

from __future__ import annotations

import functools
import getpass
import logging
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any

from mlflow.entities import Experiment
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient

from preprocessing.contract.manifest import code_version
from tracking.config import RunOrigin, TrackingConfig
from tracking.run.spool import is_local_run
from tracking.server import is_reachable, is_server, is_transient, without_credentials

KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"  # MLflow 3.17's "custom model development"
PARENT_TAG = "mlflow.parentRunId"
SOURCE_NAME_TAG, SOURCE_TYPE_TAG = "mlflow.source.name", "mlflow.source.type"
USER_TAG, COMMIT_TAG = "mlflow.user", "mlflow.source.git.commit"
_COMMIT = re.compile(r"[0-9a-f]{40}")
_WORD = re.compile(r"[a-z][a-z_-]*")
TRAINING_VIEW = "workflowType=machine_learning"  # the UI's training mode, by address

log = logging.getLogger(__name__)


def create_experiment(client: MlflowClient, config: TrackingConfig) -> str:
    """A new experiment of the config's name, in training mode; its id. Two runs started
    together (two nights at once) may both have found none: the one whose create comes
    second takes the id of the one the other made."""
    try:
        return str(
            client.create_experiment(
                config.experiment, config.artifact_location, tags={KIND_TAG: TRAINING_KIND}
            )
        )
    except MlflowException as error:
        made = client.get_experiment_by_name(config.experiment)
        if error.error_code != "RESOURCE_ALREADY_EXISTS" or made is None:
            raise
        return str(made.experiment_id)


def mark_training_kind(client: MlflowClient, experiment: Experiment) -> str:
    """Set the training kind on an experiment that names none (one made by an earlier
    release: its runs stay where they are); a kind someone chose is kept, and said. The
    experiment's kind."""
    kind = experiment.tags.get(KIND_TAG)
    if kind is None:
        client.set_experiment_tag(experiment.experiment_id, KIND_TAG, TRAINING_KIND)
        return TRAINING_KIND
    if kind != TRAINING_KIND:
        log.info(
            "MLflow experiment %r is of kind %r (not %r): kept as it is",
            experiment.name,
            kind,
            TRAINING_KIND,
        )
    return str(kind)


def command_line() -> str:
    """The command this process runs, as a person typed it: `python -m training.launch`,
    `ballast run pipeline`."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name:
        return f"python -m {spec.name.removesuffix('.__main__')}"
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "python"
    words = [program]  # then its subcommands (`run pipeline`), not its paths or flags
    for arg in sys.argv[1:3]:
        if not _WORD.fullmatch(arg):
            break
        words.append(arg)
    return " ".join(words)


@functools.cache  # one process runs one checkout: asked once, not per run
def git_sha() -> str:
    """The commit the code runs from (asked in the code's own directory: a job runs in its
    work directory, which is rarely the checkout), or outside a git checkout (an installed
    wheel) the package's version, `ballast==<version>`."""
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
            cwd=Path(__file__).parent,
        )
        return result.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        try:
            return f"ballast=={package_version('ballast')}"
        except PackageNotFoundError:
            return f"ballast (not installed; {code_version()})"


def origin_tags(config: TrackingConfig) -> dict[str, str]:
    """MLflow's source and user tags of a new run of `config`, and its parent's."""
    origin = config.origin or RunOrigin(source_name=command_line())
    tags = {
        SOURCE_NAME_TAG: origin.source_name,
        SOURCE_TYPE_TAG: origin.source_type,
        USER_TAG: origin.user or os_user(),
    }
    if config.parent_run_id is not None:
        tags[PARENT_TAG] = config.parent_run_id
    return tags


def code_tags() -> dict[str, str]:
    """The code's version: `git_sha` (as earlier releases kept it), and MLflow's source
    commit where it is one (an installed wheel has a package version instead)."""
    sha = git_sha()
    return {"git_sha": sha, COMMIT_TAG: sha} if _COMMIT.fullmatch(sha) else {"git_sha": sha}


def os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container's uid with no passwd entry
        return "unknown"


def parent_of(tags: dict[str, Any]) -> str | None:
    value = tags.get(PARENT_TAG)
    return str(value) if value is not None else None


def training_view_url(tracking_uri: str, run_id: str) -> str | None:
    """The run's page in the UI's training view, under its experiment (MLflow's `#/runs/`
    redirect drops the view); None for a local store or a run not on the server yet. A
    server that does not answer now gets the experiment-less link (MLflow's client would
    retry for minutes: M23)."""
    if not is_server(tracking_uri) or is_local_run(run_id):
        return None
    base = without_credentials(tracking_uri).rstrip("/")
    if not is_reachable(tracking_uri):
        return f"{base}/#/runs/{run_id}?{TRAINING_VIEW}"
    try:
        experiment_id = MlflowClient(tracking_uri).get_run(run_id).info.experiment_id
    except Exception as error:
        if not is_transient(error):
            raise
        return f"{base}/#/runs/{run_id}?{TRAINING_VIEW}"
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}?{TRAINING_VIEW}"
