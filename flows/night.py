"""A pipeline flow run as one MLflow run, its parent: the night (tracking/lifecycle/night.py).

The night's run is opened before anything is trained, so that every run the flow run makes
(each arm's training, the champion's scoring) is created as its child; at the end it gets
the night's summary, or is closed FAILED with the error. The two UIs link to each other:
the MLflow run carries the Prefect flow run's URL (`ballast.prefect_flow_run_url`) and the
flow run a link artifact (`mlflow-night-run`) to the MLflow run. Every MLflow run the flows
make names its source: `ballast run <flow>`, or for a deployment's run the deployment, also
as its user (`run_origin`).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from prefect.artifacts import create_link_artifact
from prefect.runtime import deployment, flow_run
from prefect.settings import PREFECT_UI_URL

from flows.params import PipelineParams
from flows.results import PipelineResult
from preprocessing.toolbox.secrets import redact
from tracking.config import RunOrigin, TrackingConfig
from tracking.lifecycle.night import (
    PREFECT_ID_TAG,
    PREFECT_URL_TAG,
    close_night,
    describe_night,
    night_metrics,
    night_tags,
    open_night,
)
from tracking.run.origin import training_view_url
from tracking.run.runs import fail_run


def run_origin() -> RunOrigin:
    """The flow run's source: its deployment (a scheduled or triggered run, a job, created
    by that deployment), else `ballast run <flow>` by the OS user."""
    flow = flow_run.get_flow_name() or "pipeline"
    name = deployment.get_name()
    if name:
        source = f"{flow}/{name}"
        return RunOrigin(source_name=source, source_type="JOB", user=f"prefect:{source}")
    return RunOrigin(source_name=f"ballast run {flow}")


def with_origin(tracking: TrackingConfig) -> TrackingConfig:
    """`tracking` with this flow run as its runs' origin (unless the config names one)."""
    return tracking if tracking.origin else tracking.model_copy(update={"origin": run_origin()})


def prefect_tags() -> dict[str, str]:
    """The flow run's id, and its page on the Prefect UI where there is one."""
    run_id, ui = flow_run.get_id(), PREFECT_UI_URL.value()
    tags = {PREFECT_ID_TAG: str(run_id)} if run_id else {}
    if run_id and ui:
        tags[PREFECT_URL_TAG] = f"{ui.rstrip('/')}/runs/flow-run/{run_id}"
    return tags


@dataclass(frozen=True)
class Night:
    """The night's run (None without tracking) and the params whose runs are its children."""

    params: PipelineParams
    tracking: TrackingConfig | None = None
    run_id: str | None = None

    def close(self, result: PipelineResult) -> PipelineResult:
        """Log the night's summary to its run and close it; `result` with its id."""
        if self.tracking is None or self.run_id is None:
            return result
        evaluations = {arm: found.model_dump() for arm, found in result.evaluations.items()}
        registration = result.registration.model_dump() if result.registration else None
        arm = next(iter(result.runs), "")  # the run's own arm, up for promotion
        tags = describe_night(night_tags(result.version_id, registration), _lines(result))
        metrics = night_metrics(evaluations, arm, registration)
        summary = result.model_dump(mode="json")
        sent = close_night(self.tracking, self.run_id, metrics, tags, summary)
        return result.model_copy(update={"night_run_id": sent})


def _lines(result: PipelineResult) -> list[str]:
    """The night's run description: the flow run, its version, each child, the decision."""
    lines = [
        f"Night of flow run `{flow_run.get_name()}`: dataset version {result.version_id}.",
        *[f"- arm `{arm}`: training run {run}" for arm, run in result.runs.items()],
    ]
    registration = result.registration
    if registration is not None:
        lines.append(f"- {registration.name} v{registration.version}: `{registration.alias}`")
        lines += [f"  - because: {reason}" for reason in registration.reasons or []]
    return lines


@contextmanager
def night_run(params: PipelineParams) -> Iterator[Night]:
    """The night's run opened, linked from the flow run, the params' tracking pointing at
    it; closed FAILED if the flow run fails (`Night.close` closes it otherwise)."""
    tracking = params.train.tracking
    if tracking is None:
        yield Night(params)
        return
    tracking = with_origin(tracking)
    run_id = open_night(tracking, flow_run.get_name() or "ballast", prefect_tags())
    _link(tracking, run_id)
    child = tracking.model_copy(update={"parent_run_id": run_id})
    train = params.train.model_copy(update={"tracking": child})
    try:
        yield Night(params.model_copy(update={"train": train}), tracking, run_id)
    except BaseException as error:
        _fail(tracking, run_id, f"{type(error).__name__}: {error}")
        raise


def _link(tracking: TrackingConfig, run_id: str) -> None:
    """The flow run's link artifact to the night's MLflow run (a run on a server)."""
    url = training_view_url(tracking.tracking_uri, run_id)
    if url is not None:
        create_link_artifact(
            url,
            link_text=f"MLflow run of this night ({run_id})",
            key="mlflow-night-run",
            description="The night's MLflow run: its summary, and the arms' runs as children",
        )


def _fail(tracking: TrackingConfig, run_id: str, reason: str) -> None:
    """Close the night's run FAILED; the flow run's own error is what is raised."""
    try:
        fail_run(tracking, run_id, reason)
    except Exception as error:
        warnings.warn(
            f"the night's MLflow run {run_id} could not be closed failed: {redact(str(error))}",
            RuntimeWarning,
            stacklevel=2,
        )
