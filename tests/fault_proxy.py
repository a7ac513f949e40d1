"""A loopback HTTP proxy in front of moto's S3 server that fails chosen GETs for real.

`FaultyS3Proxy(upstream).inject("bucket/raw/part-*", "503", times=7)` makes each object
key matching the pattern fail its next 7 GETs: `503` (SlowDown), `500` (InternalError),
`reset` (the connection closed with a TCP reset before any response) or `truncate` (the
status and the full Content-Length sent, then half the body and a reset). Every other
request is forwarded unchanged. The proxy runs in the test process; Dask workers reach
it through `AWS_ENDPOINT_URL`.
"""

from __future__ import annotations

import fnmatch
import http.client
import socket
import struct
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

FAULTS = ("503", "500", "reset", "truncate")
_ERROR_BODIES = {
    "503": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>SlowDown</Code>"
    b"<Message>Please reduce your request rate.</Message></Error>",
    "500": b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code>"
    b"<Message>We encountered an internal error. Please try again.</Message></Error>",
}
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_FORWARDED = {
    "host",
    "authorization",
    "content-type",
    "content-length",
    "content-md5",
    "range",
    "if-match",
    "if-none-match",
    "content-encoding",
}


class FaultyS3Proxy:
    """The proxy and its fault table; `served` counts the faults served per (key, fault)."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._rules: list[tuple[str, str, int]] = []
        self._left: dict[tuple[int, str], int] = {}
        self._lock = threading.Lock()
        self.served: Counter[tuple[str, str]] = Counter()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> FaultyS3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def inject(self, pattern: str, fault: str, times: int) -> None:
        """Each key matching `pattern` (`bucket/key`, fnmatch) fails its next `times` GETs."""
        assert fault in FAULTS, fault
        with self._lock:
            self._rules.append((pattern, fault, times))

    def clear(self) -> None:
        with self._lock:
            self._rules.clear()
            self._left.clear()

    def fault_for(self, method: str, key: str) -> str | None:
        """The fault this request gets, if any, counting it against its key."""
        if method != "GET":
            return None
        with self._lock:
            for index, (pattern, fault, times) in enumerate(self._rules):
                if fnmatch.fnmatchcase(key, pattern):
                    left = self._left.setdefault((index, key), times)
                    if left > 0:
                        self._left[(index, key)] = left - 1
                        self.served[(key, fault)] += 1
                        return fault
        return None


def _handler_for(proxy: FaultyS3Proxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_: object) -> None:  # quiet: the tests assert instead
            pass

        def do_request(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            key = unquote(urlsplit(self.path).path).lstrip("/")
            fault = proxy.fault_for(self.command, key)
            if fault in _ERROR_BODIES:
                self._send(int(fault), {"Content-Type": "application/xml"}, _ERROR_BODIES[fault])
            elif fault == "reset":
                self._reset()
            else:
                status, headers, payload = self._forward(body)
                if fault == "truncate":
                    self._send(status, headers, payload, num_bytes=len(payload) // 2)
                    self._reset()
                else:
                    self._send(status, headers, payload)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_request

        def _forward(self, body: bytes) -> tuple[int, dict[str, str], bytes]:
            upstream = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                sent = {
                    name: value
                    for name, value in self.headers.items()
                    if name.lower() in _FORWARDED or name.lower().startswith("x-amz-")
                }
                upstream.request(self.command, self.path, body=body or None, headers=sent)
                response = upstream.getresponse()
                payload = response.read()
                headers = {
                    name: value
                    for name, value in response.getheaders()
                    if name.lower() not in _HOP_HEADERS
                }
                if self.command == "HEAD":
                    headers["Content-Length"] = response.getheader("Content-Length") or "0"
                return response.status, headers, payload
            finally:
                upstream.close()

        def _send(
            self, status: int, headers: dict[str, str], payload: bytes, num_bytes: int | None = None
        ) -> None:
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            if self.command != "HEAD" or "Content-Length" not in headers:
                self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload[:num_bytes])
            self.wfile.flush()

        def _reset(self) -> None:
            # Linger 0: closing sends a TCP reset, as a dropped connection does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close_connection = True

    return Handler
