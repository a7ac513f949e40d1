"""The temporary Prefect API server of a `ballast` command run without `PREFECT_API_URL`,
started before the first flow with a timeout that fits a loaded machine, and given a
second try if that fails.

Prefect starts it on a flow's first API call and gives up after
`PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS` (20 s by default): its start takes
10-13 s on a quiet 2-core machine and failed at load 5-8 (docs/architecture.md M11). Started
here first, the flows' clients find it running (Prefect keeps one per process). The second
try waits on the same server process while it is alive (a new one would start its imports
over, on the same busy cores), else starts a new one. If both fail, the error says in one
line what to do instead.
"""

from __future__ import annotations

import logging
import os
import time
import urllib.request
from typing import Any

TIMEOUT_VARIABLE = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
# Several times the quiet start: a laptop busy with a build or a second run still makes it.
DEFAULT_TIMEOUT_S = 90
ATTEMPTS = 2


class TemporaryServerFailed(RuntimeError):
    """Prefect's temporary API server did not start in either attempt."""


def start_temporary_server() -> None:
    """Start Prefect's temporary API server for this process, unless `PREFECT_API_URL`
    names a server (or Prefect's temporary server is off); up to ATTEMPTS tries of
    `$PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS` (default DEFAULT_TIMEOUT_S)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    # Imported only when a server is to start: the server's modules take 3 s to import on
    # a quiet 2-core machine, which a command against a running server need not pay.
    from prefect.server.api.server import SubprocessASGIServer

    timeout_s = int(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
    # Each attempt is logged at INFO: into the command's log file, not onto the console.
    logger = logging.getLogger(__name__)
    logger.setLevel(logging.INFO)
    started, server = time.monotonic(), SubprocessASGIServer()
    for attempt in range(1, ATTEMPTS + 1):
        if _attempt(server, timeout_s, attempt):
            logger.info(
                "temporary Prefect server up after %.1f s (attempt %d of %d)",
                time.monotonic() - started,
                attempt,
                ATTEMPTS,
            )
            return
        logger.info(
            "temporary Prefect server not up after %.1f s (attempt %d of %d)",
            time.monotonic() - started,
            attempt,
            ATTEMPTS,
        )
    server.stop()
    raise TemporaryServerFailed(
        f"Prefect's temporary API server did not start within {timeout_s} s, {ATTEMPTS} "
        "times (a busy machine?): start a server once (`prefect server start`) and export "
        "PREFECT_API_URL=http://127.0.0.1:4200/api, or raise "
        f"{TIMEOUT_VARIABLE}"
    )


def _attempt(server: Any, timeout_s: int, attempt: int) -> bool:
    """Whether `server` answers within `timeout_s`: the first attempt starts it (Prefect's
    own start); a later one waits on the same process if it is still alive, else starts
    it again."""
    process = server.server_process
    if attempt > 1 and process is not None and process.poll() is None:
        if not _healthy_within(f"{server.api_url}/health", timeout_s):
            return False
        server.running = True  # Prefect's flag: its clients then use this process
        return True
    try:
        server.start(timeout=timeout_s)
    except RuntimeError:
        return False
    return True


def _healthy_within(url: str, timeout_s: float) -> bool:
    """Whether `url` answers 200 within `timeout_s` seconds."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False
