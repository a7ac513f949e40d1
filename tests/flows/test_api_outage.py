"""The end of a command whose Prefect API is gone (flows/api_outage.py): Prefect's log
service, holding a log it cannot send, is stopped at once instead of retrying it against the
dead server; with the API answering it is left to send. In this process: the service runs
on Prefect's event loop thread, the API is a loopback HTTP server in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prefect.logging.handlers import APILogWorker
from prefect.settings import (
    PREFECT_API_URL,
    PREFECT_CLIENT_MAX_RETRIES,
    PREFECT_LOGGING_TO_API_BATCH_INTERVAL,
    temporary_settings,
)

from flows.api_outage import api_answers, stop_api_services, unsent_work_dropped_when_api_down
from tests.services import free_port

# Prefect's default five retries back off 2 + 4 + 8 + 16 + 32 s: a send that is waited
# for takes a minute; a stopped service ends within a second or two.
RETRIES = 5
# The service sends a batch every 2 s by default; 0.2 s here, so a log is in flight soon.
BATCH_INTERVAL_S = 0.2
STOPPED_WITHIN_S = 10.0


class Api(BaseHTTPRequestHandler):
    """An API that answers its health check and takes logs, counting the posts."""

    server: Server

    def do_GET(self) -> None:
        self.send_response(200 if self.path.endswith("/health") else 404)
        self.end_headers()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(201)
        self.end_headers()
        self.server.posts.release()

    def log_message(self, *args: object) -> None:
        pass


class Server(ThreadingHTTPServer):
    posts = threading.Semaphore(0)  # replaced per server


class LoopbackApi:
    """`Api` on a free loopback port, in a thread, until `stop`."""

    def __init__(self) -> None:
        self.server = Server(("127.0.0.1", 0), Api)
        self.server.posts = threading.Semaphore(0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/api"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api() -> Iterator[LoopbackApi]:
    running = LoopbackApi()
    try:
        yield running
    finally:
        running.stop()


def queue_a_log() -> APILogWorker:
    """A log for the API, sent by the service's next batch (within its interval)."""
    worker = APILogWorker.instance()
    worker.send(
        {
            "name": "ballast.test",
            "level": 20,
            "message": "a log for the API",
            "timestamp": datetime.now(UTC).isoformat(),
        }
    )
    return worker


def test_a_dead_api_is_told_apart_from_an_answering_one(api: LoopbackApi) -> None:
    """Invariant: the health check says True for an API that answers 200, False for a
    closed port."""
    assert api_answers(api.url)
    assert not api_answers(f"http://127.0.0.1:{free_port()}/api")


def test_a_failed_flow_with_its_api_gone_stops_the_log_service_at_once() -> None:
    """Invariant: a failure once the API is gone stops the log service, a log in flight
    with Prefect's default retries (a minute of back-off: the client reached the API
    before, so a refused connection is retried) included, within STOPPED_WITHIN_S, and
    re-raises the failure; the service is no longer there to wait for at exit."""
    api = LoopbackApi()
    with temporary_settings(
        {
            PREFECT_API_URL: api.url,
            PREFECT_CLIENT_MAX_RETRIES: RETRIES,
            PREFECT_LOGGING_TO_API_BATCH_INTERVAL: BATCH_INTERVAL_S,
        }
    ):
        queue_a_log()
        assert api.server.posts.acquire(timeout=30), "the first log never reached the API"
        api.stop()
        worker = queue_a_log()
        time.sleep(1)  # its batch is sent and refused, the retries' back-off begun
        started = time.monotonic()
        with (
            pytest.raises(RuntimeError, match="the flow failed"),
            unsent_work_dropped_when_api_down(),
        ):
            raise RuntimeError("the flow failed")
        assert time.monotonic() - started < STOPPED_WITHIN_S
    assert worker._stopped and worker._done_event is not None and worker._done_event.is_set()
    assert stop_api_services() == 0  # nothing left to stop


def test_a_failed_flow_with_its_api_answering_leaves_the_service_to_send(
    api: LoopbackApi,
) -> None:
    """Invariant: a failure with the API answering leaves the log service running (its
    logs reach the server at exit, as Prefect does)."""
    with temporary_settings(
        {PREFECT_API_URL: api.url, PREFECT_LOGGING_TO_API_BATCH_INTERVAL: BATCH_INTERVAL_S}
    ):
        worker = queue_a_log()
        with pytest.raises(RuntimeError), unsent_work_dropped_when_api_down():
            raise RuntimeError("the flow failed")
        assert not worker._stopped
        stop_api_services()
