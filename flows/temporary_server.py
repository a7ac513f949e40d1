"""The temporary Prefect API server of a `ballast` command run without `PREFECT_API_URL`,
started before the first flow with a timeout that fits a loaded machine, and once more if
that fails.

Prefect starts it on a flow's first API call and gives up after
`PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS` (20 s by default): its start takes
10-13 s on a quiet 2-core machine and failed at load 5-8 (docs/architecture.md M11). Started
here first, the flows' clients find it running (Prefect keeps one per process). If both
tries fail, the error says in one line what to do instead.
"""

from __future__ import annotations

import logging
import os
import time

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
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    timeout_s = int(os.environ.get(TIMEOUT_VARIABLE) or DEFAULT_TIMEOUT_S)
    # Each attempt is logged at INFO: into the command's log file, not onto the console.
    logger = logging.getLogger(__name__)
    logger.setLevel(logging.INFO)
    for attempt in range(1, ATTEMPTS + 1):
        server, started = SubprocessASGIServer(), time.monotonic()
        try:
            server.start(timeout=timeout_s)
        except RuntimeError as error:
            # A failed start leaves its process running: stop it before the next one.
            server.stop()
            logger.info("temporary Prefect server, attempt %d of %d: %s", attempt,
                        ATTEMPTS, error)
            continue
        logger.info("temporary Prefect server up in %.1f s (attempt %d of %d)",
                    time.monotonic() - started, attempt, ATTEMPTS)
        return
    raise TemporaryServerFailed(
        f"Prefect's temporary API server did not start within {timeout_s} s, {ATTEMPTS} "
        "times (a busy machine?): start a server once (`prefect server start`) and export "
        "PREFECT_API_URL=http://127.0.0.1:4200/api, or raise "
        f"{TIMEOUT_VARIABLE}")
