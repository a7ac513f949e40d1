"""What `ballast run` prints: ballast's progress and a short result, libraries' INFO lines
only in the command's log file, the full result as JSON."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path

import pytest

from flows.cli.console import ProgressOnly, command_logging, worker_logging
from tests.cli_pipeline import CliRun

MAX_CONSOLE_LINES = 40


def _record(name: str, level: int, message: str) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, None, None)


def test_a_quiet_console_keeps_progress_warnings_and_errors_only() -> None:
    """Invariant: the quiet filter passes the flow's own lines, warnings and errors, and
    drops libraries' INFO lines, Prefect's state lines and Dask's housekeeping warnings."""
    quiet = ProgressOnly()
    kept = [
        _record("prefect.flow_runs", logging.INFO, "reshard[rebalanced]: dataset ..."),
        _record("prefect.task_runs", logging.INFO, "reshard progress no longer ..."),
        _record("tracking.run.runs", logging.WARNING, "MLflow could not take the run"),
        _record("prefect.task_runs", logging.ERROR, "Finished in state Failed()"),
        _record("distributed.worker", logging.ERROR, "Compute failed"),
    ]
    dropped = [
        _record("distributed.scheduler", logging.INFO, "State start"),
        _record("distributed.nanny", logging.WARNING, "Worker process still alive"),
        _record("prefect", logging.INFO, "Starting temporary server"),
        _record("prefect.task_runs", logging.INFO, "Finished in state Completed()"),
        _record("mlflow.store.db.utils", logging.INFO, "Creating initial tables"),
    ]
    assert all(quiet.filter(record) for record in kept)
    assert not any(quiet.filter(record) for record in dropped)


def test_ballasts_own_info_lines_reach_the_log_file_not_a_quiet_console(tmp_path: Path) -> None:
    """Invariant: while a command's logging is on, an INFO line of ballast's packages below
    the flows (which SLURM job a step ran as) is in the log file and not on a quiet
    console; the package's level is put back after."""
    console, own = io.StringIO(), logging.getLogger("training.launch.slurm")
    handler, level = logging.StreamHandler(console), logging.getLogger("training").level
    logging.getLogger().addHandler(handler)
    try:
        with command_logging(tmp_path / "run.log", verbose=False):
            own.info("training job t: SLURM job 7")
    finally:
        logging.getLogger().removeHandler(handler)
    assert "INFO training.launch.slurm: training job t: SLURM job 7" in (
        (tmp_path / "run.log").read_text()
    )
    assert "SLURM job 7" not in console.getvalue()
    assert logging.getLogger("training").level == level


def test_dask_workers_log_into_the_command_file_and_errors_only_on_a_quiet_console(
    tmp_path: Path,
) -> None:
    """Invariant: the workers' logging config sends `distributed` to the log file and
    to stderr at ERROR (INFO with -v), and leaves other loggers alone."""
    quiet = worker_logging(tmp_path / "run.log", verbose=False)
    handlers = quiet["handlers"]
    assert isinstance(handlers, dict)
    assert handlers["file"]["filename"] == str(tmp_path / "run.log")
    assert handlers["console"]["level"] == "ERROR"
    assert quiet["disable_existing_loggers"] is False
    verbose = worker_logging(tmp_path / "run.log", verbose=True)["handlers"]
    assert isinstance(verbose, dict) and verbose["console"]["level"] == "INFO"


def test_a_quiet_console_turns_mlflow_artifact_progress_bars_off_and_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: MLflow's artifact progress bars (a model loaded from a tracking server;
    every tqdm redraw is a console line) are off while the console is quiet, in this
    process's environment (so in the Dask workers and ranks it starts), and as before
    after."""
    from mlflow.environment_variables import MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR as BARS

    from tracking.console import quiet_mlflow_events

    monkeypatch.delenv(BARS.name, raising=False)
    with quiet_mlflow_events():
        assert os.environ[BARS.name] == "false" and not BARS.get()
    assert BARS.name not in os.environ and BARS.get()


@pytest.mark.slow
def test_a_pipeline_run_prints_at_most_40_lines_and_the_full_result_as_json(
    cli_pipeline_run: CliRun,
) -> None:
    """Invariants: `ballast run pipeline` of both arms (a new user's: a temporary Prefect
    server, a fresh Prefect home; tests/cli_pipeline.py) prints at most 40 lines, none of
    them Dask's INFO lines or MLflow's type-hint warning; the log file it names holds
    Dask's lines; `--result-file` holds the full result (both arms' evaluations with
    per-class recall, the registration)."""
    run = cli_pipeline_run.run
    printed = (run.stdout + run.stderr).splitlines()
    assert len(printed) <= MAX_CONSOLE_LINES, "\n".join(printed)
    assert not [line for line in printed if "distributed." in line or "type hints" in line]
    log = Path(run.stdout.rsplit("log: ", 1)[1].strip())
    assert "distributed.scheduler" in log.read_text()
    result = json.loads((cli_pipeline_run.root / "result.json").read_text())
    assert set(result["evaluations"]) == {"rebalanced", "natural-mix"}
    assert all(evaluation["recall"] for evaluation in result["evaluations"].values())
    assert result["registration"]["version"] == 1


def _log_on_worker(message: str) -> int:
    """Log `message` at INFO from inside a Dask worker process; the worker's pid."""
    logging.getLogger("distributed.worker").info(message)
    return os.getpid()


@pytest.mark.slow
@pytest.mark.parametrize("verbose", [False, True])
def test_the_run_log_file_gets_dask_workers_info_lines_the_console_only_with_v(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], verbose: bool
) -> None:
    """Invariants: under a command's logging, a LocalCluster's worker processes and its
    scheduler write their INFO lines (a worker's start, a line logged in a task) to the
    command's log file, not raised to WARNING by the cluster's `silence_logs`; the
    console (this process's and the workers' stderr) shows them only with -v."""
    from flows.cli.console import DASK_LOGGING_ENV, command_logging
    from preprocessing.driver.cluster import WORKER_LOGGING_ENV, DaskConfig, dask_client

    assert DASK_LOGGING_ENV == WORKER_LOGGING_ENV
    path = tmp_path / "run.log"
    marker = f"ballast-marker-{verbose}"
    with command_logging(path, verbose), dask_client(DaskConfig(num_workers=1)) as client:
        worker_pid = client.submit(_log_on_worker, marker, pure=False).result()
    assert worker_pid != os.getpid()
    text = path.read_text()
    assert marker in text and "distributed.worker" in text
    assert "Start worker at" in text and "distributed.scheduler" in text
    console = capfd.readouterr().err
    assert (marker in console) is verbose
    assert ("Start worker at" in console) is verbose
