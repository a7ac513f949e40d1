"""moto's S3 server on loopback with a log of every request it answers (method, key, bytes).

The log counts what a reshard asks of an object store: requests per stage (inputs,
staging, output) and the bytes each moved. moto keeps its buckets in process-wide
state, so objects made through another moto server of this process are visible here.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import make_server

from tests.services import free_port


@dataclass(frozen=True)
class Request:
    """One answered request: `bytes_moved` is the request body of a write, the response
    body of a read."""

    method: str
    path: str
    query: str
    bytes_moved: int


class RequestLog:
    """Thread-safe list of answered requests."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: list[Request] = []

    def add(self, request: Request) -> None:
        with self._lock:
            self.requests.append(request)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def matching(self, part: str) -> list[Request]:
        """Requests whose key contains `part`."""
        return [request for request in self.requests if part in request.path]


class _Counting:
    """WSGI middleware: forwards to moto and logs each request with its body size."""

    def __init__(self, app: Any, log: RequestLog) -> None:
        self.app, self.log = app, log

    def __call__(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        sent = int(environ.get("CONTENT_LENGTH") or 0)
        chunks = list(self.app(environ, start))
        received = sum(len(chunk) for chunk in chunks)
        method = environ["REQUEST_METHOD"]
        self.log.add(
            Request(
                method,
                unquote(environ.get("PATH_INFO", "")),
                environ.get("QUERY_STRING", ""),
                sent if method in ("PUT", "POST") else received,
            )
        )
        return chunks


class _QuietHandler(MotoRequestHandler):
    def log_request(self, *args: Any) -> None:  # one line per request drowns a test's output
        pass


class CountingMotoServer(ThreadedMotoServer):
    """ThreadedMotoServer whose app logs every request into `log`."""

    def __init__(self, log: RequestLog, port: int) -> None:
        super().__init__(ip_address="127.0.0.1", port=port, verbose=False)
        self.log = log

    def _server_entry(self) -> None:
        app = _Counting(DomainDispatcherApplication(create_backend_app), self.log)
        self._server = make_server(
            self._ip_address, self._port, app, True, request_handler=_QuietHandler
        )
        self._server_ready_event.set()
        self._server.serve_forever()


@contextmanager
def counted_s3() -> Iterator[RequestLog]:
    """A counting moto server; the AWS_* environment (and so every process started in
    the block, Dask workers too) points at it, and s3fs forgets clients made before."""
    import s3fs

    log = RequestLog()
    server = CountingMotoServer(log, free_port())
    server.start()
    host, port = server.get_host_and_port()
    settings = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        yield log
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        s3fs.S3FileSystem.clear_instance_cache()
