"""Real local services for tests, each a subprocess on loopback that the fixture stops."""

from __future__ import annotations

import os
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


# MLflow's job runner (7 huey consumer processes per server, for its GenAI jobs) is
# nothing ballast uses; on 2 cores it doubled a server's start and its SIGTERM left the
# consumers behind until stop_server's 30 s timeout.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def start_mlflow_server(
    directory: Path, port: int, artifacts: str | None = None, timeout_s: float = 90
) -> subprocess.Popen:
    """`mlflow server` on `port` with a sqlite backend in `directory`; returns once healthy.
    Artifacts are proxied to `artifacts` (a local folder by default, or an s3:// URI)."""
    log = open(directory / f"mlflow-server-{port}.log", "ab")  # noqa: SIM115 - child owns it
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{directory}/mlflow.db",
            "--artifacts-destination",
            artifacts or str(directory / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **MLFLOW_SERVER_ENV},
    )
    log.close()
    wait_for_http(f"http://127.0.0.1:{port}/health", process, timeout_s)
    return process


def start_prefect_server(
    env: dict[str, str], port: int, timeout_s: float = 180
) -> subprocess.Popen:
    """`prefect server start` on `port` with the environment `env` (its database under
    `PREFECT_HOME`, which a restart on the same port reuses); returns once healthy."""
    log = (Path(env["PREFECT_HOME"]) / "server.log").open("ab")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    wait_for_http(f"http://127.0.0.1:{port}/api/health", server, timeout_s)
    return server


def prefect_env(home: Path, port: int) -> dict[str, str]:
    """This process's environment pointed at a Prefect server on `port` with home `home`."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
    }


def stop_server(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@contextmanager
def mlflow_server(directory: Path, artifacts: str | None = None) -> Iterator[str]:
    """A healthy `mlflow server` for the block; yields its URI."""
    port = free_port()
    process = start_mlflow_server(directory, port, artifacts)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)


@contextmanager
def moto_s3() -> Iterator[str]:
    """moto's S3 server on a free loopback port; the AWS_* environment points boto at it."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port())
    server.start()
    host, port = server.get_host_and_port()
    settings = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "MLFLOW_S3_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
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
