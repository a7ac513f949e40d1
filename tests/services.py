"""Real local services for tests, each a subprocess on loopback that the fixture stops."""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock


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


# A new Prefect database: Prefect's migrations (115 for sqlite) and its block types
# registered, as a server does at its first start.
PREFECT_DATABASE_SCRIPT = """
import asyncio
from prefect.server.database import provide_database_interface
from prefect.server.models.block_registration import run_block_auto_registration

async def main():
    db = provide_database_interface()
    await db.create_db()
    async with await db.session() as session:
        await run_block_auto_registration(session=session)
        await session.commit()

asyncio.run(main())
"""
# A server on a copy of that database: its blocks are there already. Migrating a new
# database was 60% of a Prefect server's start (11 of 18 CPU-s, 13 s of a 20 s start on
# this 2-core host), paid by every server of the suite; the copy's start is 4.7 CPU-s.
PREMIGRATED_ENV = {
    "PREFECT_API_BLOCKS_REGISTER_ON_START": "false",
    "PREFECT_MEMOIZE_BLOCK_AUTO_REGISTRATION": "false",
}


def prefect_database(directory: Path) -> Path:
    """A Prefect database at the installed Prefect's schema, made once in `directory`
    (the xdist workers of a run share it: the first makes it under a file lock)."""
    database = directory / "prefect-template.db"
    with (directory / "prefect-template.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not database.exists():
            partial = directory / "prefect-template.db.partial"
            env = {
                **os.environ,
                "PREFECT_HOME": str(directory / "prefect-template-home"),
                "PREFECT_SERVER_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{partial}",
            }
            subprocess.run(
                [sys.executable, "-c", PREFECT_DATABASE_SCRIPT], env=env, check=True, timeout=600
            )
            partial.rename(database)
    return database


def seed_prefect_database(database: Path, target: Path) -> dict[str, str]:
    """Copy the migrated `database` to `target` unless a database is there (a restart's);
    the settings of a server that starts on it."""
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(database, target)
    return PREMIGRATED_ENV


def start_prefect_server(
    env: dict[str, str], port: int, timeout_s: float = 180, database: Path | None = None
) -> subprocess.Popen:
    """`prefect server start` on `port` with the environment `env` (its database under
    `PREFECT_HOME`, which a restart on the same port reuses); returns once healthy. A new
    home starts from a copy of `database` (prefect_database) when given."""
    if database is not None:
        env = {**env, **seed_prefect_database(database, Path(env["PREFECT_HOME"]) / "prefect.db")}
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


@contextmanager
def prefect_test_harness(database: Path, timeout_s: int) -> Iterator[None]:
    """Prefect's test harness (a temporary API server, prefect.testing.utilities) on a
    copy of `database`: the harness puts its database in a new temporary directory, which
    is given the copy first."""
    from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL
    from prefect.testing import utilities

    seeded: list[Path] = []

    def seeded_directory() -> str:
        seeded.append(Path(tempfile.mkdtemp()) / "prefect-test.db")
        seed_prefect_database(database, seeded[-1])
        return str(seeded[-1].parent)

    with ExitStack() as harness:
        with (
            mock.patch.object(utilities, "mkdtemp", seeded_directory),
            mock.patch.dict(os.environ, PREMIGRATED_ENV),
        ):
            harness.enter_context(utilities.prefect_test_harness(timeout_s))
        # Loud if a Prefect release names the harness's database otherwise: its server
        # would run without block types.
        if not seeded or not str(PREFECT_SERVER_DATABASE_CONNECTION_URL.value()).endswith(
            str(seeded[0])
        ):
            raise RuntimeError("Prefect's test harness did not start on the seeded database")
        yield


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
