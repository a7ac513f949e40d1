"""Prefect's temporary API server of a `ballast` command without `PREFECT_API_URL`
(flows/temporary_server.py): tried twice, then one line saying what to do."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.temporary_server import ATTEMPTS, TIMEOUT_VARIABLE


@pytest.mark.slow
def test_a_server_that_never_starts_is_tried_twice_then_one_line_says_what_to_do(
    tmp_path: Path,
) -> None:
    """Invariants: with a start timeout no start can meet (1 s; a start takes 10 s or more),
    `ballast run` exits 1 printing one line that names the timeout, the variable and
    `PREFECT_API_URL`; its log holds both attempts; no flow ran (nothing written)."""
    env = {
        name: value
        for name, value in os.environ.items()
        if name not in ("PREFECT_API_URL", TIMEOUT_VARIABLE)
    }
    env.update(
        {
            "PREFECT_HOME": str(tmp_path / "home"),
            TIMEOUT_VARIABLE: "1",
            "BALLAST_LOG_DIR": str(tmp_path / "logs"),
            "PREFECT_UI_ENABLED": "false",
        }
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows",
            "run",
            "pipeline",
            "--config",
            "demo",
            "--work-dir",
            str(tmp_path / "work"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert f"did not start within 1 s, {ATTEMPTS} times" in lines[0]
    assert "export PREFECT_API_URL=" in lines[0] and TIMEOUT_VARIABLE in lines[0]
    log = re.search(r"\(traceback: (.+)\)$", lines[0])
    assert log, lines[0]
    attempts = re.findall(
        r"temporary Prefect server not up after [\d.]+ s \(attempt (\d) of 2\)",
        Path(log[1]).read_text(),
    )
    assert attempts == ["1", "2"]
    assert not (tmp_path / "work").exists()
