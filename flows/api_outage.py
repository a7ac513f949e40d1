"""The end of a `ballast` command whose Prefect API server stopped answering.

Prefect ships a run's logs and events to its API from background services, and at the
interpreter's exit it waits for them to send everything still queued, each request retried
`PREFECT_CLIENT_MAX_RETRIES` times with exponential back-off (2 + 4 + ... + 32 s by
default): a run whose server was gone printed its error and then hung, 8 s with one retry
and over 80 s with Prefect's default five, sending logs to nothing. When a command's flow
fails and the API does not answer its health check, the services are stopped at once and
what they still held is left unsent (the command's log file has all of it). A failure with
the API answering waits for the services as before: its logs reach the server.
"""

from __future__ import annotations

import concurrent.futures
import logging
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

HEALTH_TIMEOUT_S = 2.0
STOP_TIMEOUT_S = 5.0

logger = logging.getLogger(__name__)


@contextmanager
def unsent_work_dropped_when_api_down() -> Iterator[None]:
    """Around a command's flow: if the flow fails and the Prefect API does not answer,
    stop Prefect's log and event services without sending what they hold."""
    try:
        yield
    except Exception:
        url = _api_url()
        if url is not None and not api_answers(url):
            dropped = stop_api_services()
            logger.warning(
                "the Prefect API at %s does not answer: %d unsent logs and events dropped "
                "(they are in this command's log file)",
                url,
                dropped,
            )
        raise


def _api_url() -> str | None:
    """The API this process talks to; None for the command's own temporary server (a
    child process that lives as long as the command)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_answers(url: str, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """Whether `url`/health answers 200 within `timeout_s` seconds."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/health", timeout=timeout_s) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def stop_api_services() -> int:
    """Cancel Prefect's log and event services (each a task on Prefect's global event loop)
    and wait until they have stopped; returns how many queued items they dropped. Their
    exit hooks then find them stopped and return at once."""
    from prefect._internal.concurrency.services import _QueueServiceBase
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    instances: dict[int, Any] = _QueueServiceBase._instances  # type: ignore[misc]
    services = [
        service
        for service in list(instances.values())
        if isinstance(service, APILogWorker | EventsWorker)
    ]
    dropped = sum(service._queue.qsize() for service in services)
    stopped = [_cancel(service) for service in services]
    concurrent.futures.wait([future for future in stopped if future], timeout=STOP_TIMEOUT_S)
    return dropped


def _cancel(service: Any) -> concurrent.futures.Future[bool] | None:
    """Cancel `service`'s task (an in-flight request with its retries included); the
    future of its end, or None when it never ran here."""
    task, loop = service._task, service._loop
    if task is None or loop is None:
        return None
    loop.call_soon_threadsafe(task.cancel)
    future: concurrent.futures.Future[bool] = service._drain()
    return future
