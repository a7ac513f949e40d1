"""What a refused or a failed `ballast run` prints: its cause on one line with the log file
that holds the traceback, a few lines in all, no traceback on the console (with `-v`, the
traceback too). Each case is a `ballast` command of its own, as a user runs it, against
the session's Prefect server (a temporary one would cost its start and check nothing
about the console)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

pytestmark = pytest.mark.slow
MAX_REFUSAL_LINES = 15


def _ballast(tmp_path: Path, config: dict, *flags: str) -> subprocess.CompletedProcess[str]:
    from prefect.settings import PREFECT_API_URL

    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {
        **os.environ,
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        "BALLAST_LOG_DIR": str(tmp_path / "logs"),
        "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s",
    }
    return subprocess.run(
        [sys.executable, "-m", "flows", "run", "reshard", "--config", str(path), *flags],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )


def _config(tmp_path: Path, **dask: str) -> dict:
    """A reshard of one small file whose config names a source column the file lacks (the
    reshard refuses it), on Dask as `dask` says."""
    rng = np.random.default_rng(0)
    (tmp_path / "raw").mkdir(exist_ok=True)
    pq.write_table(
        pa.table({"label": rng.choice(["a", "b"], 50), "x": rng.normal(size=50)}),
        tmp_path / "raw" / "part.parquet",
    )
    return {
        "reshard": {
            "dataset": {
                "inputs": [str(tmp_path / "raw")],
                "label_column": "label",
                "source_column": "source",
                "feature_columns": ["x"],
            },
            "output_root": str(tmp_path / "out"),
            "num_workers": 1,
        },
        "dask": dask or {"kind": "local", "num_workers": 1},
    }


def _check_printed(run: subprocess.CompletedProcess[str], cause: str) -> Path:
    """The invariants of every case; the log file the last lines name."""
    printed = (run.stdout + run.stderr).splitlines()
    assert len(printed) <= MAX_REFUSAL_LINES, "\n".join(printed)
    assert not [line for line in printed if "Traceback" in line or line.startswith("  File")]
    last = next(line for line in reversed(printed) if line.startswith("ballast run: "))
    assert cause in last, last
    log = Path(last.rsplit("(traceback: ", 1)[1].rstrip(")"))
    assert "Traceback (most recent call last)" in log.read_text()
    return log


def test_a_refused_run_prints_its_cause_and_log_in_a_few_lines(
    prefect_harness: None, tmp_path: Path
) -> None:
    """Invariants: a reshard refused inside the flow (a source column no file has) exits 2
    and prints at most 15 lines, no traceback, the cause naming the field last with the
    log file, which holds the traceback."""
    run = _ballast(tmp_path, _config(tmp_path))
    assert run.returncode == 2, run.stderr
    _check_printed(run, "dataset.source_column is 'source'")


def test_a_failed_run_prints_its_cause_in_a_few_lines_and_the_traceback_with_v(
    prefect_harness: None, tmp_path: Path
) -> None:
    """Invariants: a run that fails (no Dask scheduler at the configured address) exits 4
    (a service that may answer later),
    prints at most 15 lines, no traceback, the cause and the log last; with `-v` the
    console shows the traceback too."""
    dask = {"kind": "address", "address": "tcp://127.0.0.1:9"}
    run = _ballast(tmp_path, _config(tmp_path, **dask))
    assert run.returncode == 4, run.stderr
    _check_printed(run, "127.0.0.1:9")
    verbose = _ballast(tmp_path, _config(tmp_path, **dask), "-v")
    assert verbose.returncode == 4
    assert "Traceback (most recent call last)" in verbose.stderr
