"""The Prefect API server stopped mid-flow: the flow fails, the committed work stays, and the
rerun after a restart reuses it. A real `prefect server start` process on loopback and the
`reshard` flow run by `ballast run` in a process of its own."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
import yaml

from preprocessing.contract.manifest import read_current_version, read_manifest
from tests.services import free_port, prefect_env, start_prefect_server, stop_server

ERROR_LINE = b"ballast run: "
SEND_FAILED = b"--- Error logging to API ---"
# The exit after the error line: an interpreter's teardown, no request to the dead server
# (one retried request alone waits 2 s here, 62 s at Prefect's default five retries).
EXIT_BOUND_S = 10.0


class TimedOutput(threading.Thread):
    """Copies a process's output into `log` line by line, keeping when each line came."""

    def __init__(self, output: IO[bytes], log: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.output, self.log = output, log
        self.lines: list[tuple[float, bytes]] = []
        self.start()

    def run(self) -> None:
        for line in self.output:
            self.lines.append((time.monotonic(), line))
            self.log.write(line)

    def after(self, marker: bytes) -> tuple[float, list[bytes]]:
        """When the first line holding `marker` came, and the lines from it on."""
        index = next(i for i, (_, line) in enumerate(self.lines) if marker in line)
        return self.lines[index][0], [line for _, line in self.lines[index:]]


def wait_for_staging(output_root: Path, flow: subprocess.Popen, timeout_s: float) -> None:
    """Poll until the reshard's attempt directory exists: the reshard has begun."""
    deadline = time.monotonic() + timeout_s
    while not list(output_root.glob("_staging/*/*")):
        assert flow.poll() is None, "the flow exited before its reshard began"
        assert time.monotonic() < deadline, "the reshard did not begin"
        time.sleep(0.05)


def snapshot(output_root: Path) -> dict[str, int]:
    """Every file of the committed versions and its modification time (ns)."""
    return {
        str(path.relative_to(output_root)): path.stat().st_mtime_ns
        for path in output_root.glob("v-*/**/*")
        if path.is_file()
    }


@pytest.mark.slow
def test_prefect_server_stopped_mid_reshard_rerun_reuses_the_version(
    tiny_raw, tmp_path, prefect_database
):
    """Fault: the API server is stopped while the reshard runs (the flow's process is
    paused with SIGSTOP from the moment its reshard begins until the server is gone, so
    the order is certain). Invariants: the flow exits non-zero naming the connection
    error, and within EXIT_BOUND_S of its error line, without another request to the dead
    server (flows/api_outage.py); the reshard still commits its version (progress is best
    effort) and leaves no staging; after a restart on the same database the rerun exits 0
    with the same version, found cached or committed, and no file of the version is
    written again."""
    output_root = tmp_path / "datasets"
    config = tmp_path / "reshard.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "reshard": {
                    "dataset": {"inputs": [str(tiny_raw)]},
                    "output_root": str(output_root),
                    "target_shard_rows": 600,
                },
                "dask": {"kind": "local", "num_workers": 1},
            }
        )
    )
    port = free_port()
    # One client retry per request: the flow gives up on the stopped server in seconds
    # (the default, five with backoff, takes about a minute per request).
    env = {**prefect_env(tmp_path / "prefect-home", port), "PREFECT_CLIENT_MAX_RETRIES": "1"}
    command = [
        sys.executable,
        "-m",
        "flows",
        "run",
        "reshard",
        "--config",
        str(config),
        "--output",
        "json",
    ]
    server = start_prefect_server(env, port, database=prefect_database)
    log = (tmp_path / "flow.log").open("wb")
    flow = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    output = TimedOutput(flow.stdout, log)  # type: ignore[arg-type]
    try:
        wait_for_staging(output_root, flow, timeout_s=300)
        flow.send_signal(signal.SIGSTOP)
        stop_server(server)
        flow.send_signal(signal.SIGCONT)
        assert flow.wait(timeout=400) != 0
        exited = time.monotonic()
        output.join(timeout=30)
    finally:
        if flow.poll() is None:
            flow.kill()
        log.close()
    error_at, last_lines = output.after(ERROR_LINE)
    assert exited - error_at < EXIT_BOUND_S, (exited - error_at, last_lines)
    assert not [line for line in last_lines if SEND_FAILED in line], last_lines
    assert "Connection refused" in (tmp_path / "flow.log").read_text()
    manifest, _ = read_manifest(str(output_root))
    assert read_current_version(str(output_root)) == manifest.version_id
    assert not list(output_root.glob("_staging/*/*"))
    committed = snapshot(output_root)

    server = start_prefect_server(env, port, database=prefect_database)
    try:
        rerun = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    finally:
        stop_server(server)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    result = yaml.safe_load(rerun.stdout)
    assert result["version_id"] == manifest.version_id
    assert result["reused"]  # found cached by version id, or committed: no reshard work
    assert snapshot(output_root) == committed
    assert not list(output_root.glob("_staging/*/*"))
