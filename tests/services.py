"""Real local services for tests, each a subprocess on loopback that the fixture stops."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_for_http(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    """Poll `url` until it answers 200; fail early with the log if the process died."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"service exited with {process.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{url} did not answer within {timeout_s} s")


@contextmanager
def mlflow_server(directory: Path) -> Iterator[str]:
    """`mlflow server` with a sqlite backend and proxied local artifacts; yields its URI."""
    port = free_port()
    log = open(directory / "mlflow-server.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
         "--backend-store-uri", f"sqlite:///{directory}/mlflow.db",
         "--artifacts-destination", str(directory / "artifacts"), "--workers", "1"],
        stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        wait_for_http(f"http://127.0.0.1:{port}/health", process, timeout_s=90)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server on a free loopback port; the AWS_* environment points boto at it."""
    import os

    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield settings["AWS_ENDPOINT_URL"]
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
