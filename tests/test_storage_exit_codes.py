"""One storage error table for every S3 URI a command is given (preprocessing/storage/reach.py,
preprocessing/contract/exit_status.py): a config, the inputs or the output root on S3,
for `python -m preprocessing`, `ballast run` and `ballast verify` alike. An endpoint that
does not answer exits 4 within 5 s, naming the endpoint and the setting it came from; a
bucket that does not exist exits 5, naming the bucket. Before: a config whose endpoint did
not answer exited 1 after 7.1 s, one in a missing bucket 2 ("no such file")."""

from __future__ import annotations

import socket
import time
import uuid
from pathlib import Path

import pytest
import s3fs
import yaml

from flows.cli.main import main as ballast
from preprocessing.__main__ import main as preprocessing
from preprocessing.contract.exit_status import STORAGE_REFUSED, TRANSIENT

# Which of a command's URIs each can take: `ballast verify` is given only a root.
PLACES = {
    "preprocessing": ("config", "inputs", "output"),
    "run": ("config", "inputs", "output"),
    "verify": ("output",),
}
CASES = [(command, place) for command, places in PLACES.items() for place in places]


def closed_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def command_line(command: str, place: str, s3_root: str, tmp_path: Path) -> list[str]:
    """The command with the S3 URI at `place` and everything else on local disk."""
    raw, out = tmp_path / "raw", tmp_path / "out"
    raw.mkdir(exist_ok=True)
    if command == "verify":
        return ["verify", s3_root]
    reshard = {
        "dataset": {"inputs": [f"{s3_root}/raw" if place == "inputs" else str(raw)]},
        "output_root": f"{s3_root}/out" if place == "output" else str(out),
    }
    document = {"reshard": reshard} if command == "run" else reshard
    config = tmp_path / "reshard.yaml"
    config.write_text(yaml.safe_dump(document))
    where = f"{s3_root}/reshard.yaml" if place == "config" else str(config)
    return ["run", "reshard", "--config", where] if command == "run" else ["--config", where]


def run(command: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr) of the command, run in this process as its entry point."""
    capsys.readouterr()
    status = preprocessing(argv) if command == "preprocessing" else ballast(argv)
    return status, capsys.readouterr().err


@pytest.mark.slow  # moto's S3 server, and a Prefect-importing CLI
@pytest.mark.parametrize(("command", "place"), CASES)
def test_a_dead_endpoint_exits_4_in_seconds_naming_it_and_its_setting(
    command: str,
    place: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: an S3 endpoint that refuses every connection, reached through the
    command's config, inputs or output, exits 4 within 5 s, one line naming the endpoint
    and AWS_ENDPOINT_URL."""
    monkeypatch.setenv("BALLAST_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    endpoint = f"http://127.0.0.1:{closed_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    s3fs.S3FileSystem.clear_instance_cache()
    argv = command_line(command, place, "s3://ballast-dead", tmp_path)
    started = time.monotonic()
    status, err = run(command, argv, capsys)
    seconds = time.monotonic() - started
    assert (status, seconds < 5) == (TRANSIENT, True), f"{seconds:.1f} s: {err}"
    assert endpoint in err and "AWS_ENDPOINT_URL" in err, err
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.mark.slow  # moto's S3 server, and a Prefect-importing CLI
@pytest.mark.parametrize(("command", "place"), CASES)
def test_a_missing_bucket_exits_5_naming_it(
    command: str,
    place: str,
    s3_endpoint: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: a bucket that does not exist, named by the command's config, inputs or
    output, exits 5 with one line naming the bucket, whichever it was."""
    monkeypatch.setenv("BALLAST_LOG_DIR", str(tmp_path / "logs"))
    bucket = f"ballast-missing-{uuid.uuid4().hex[:8]}"
    status, err = run(command, command_line(command, place, f"s3://{bucket}", tmp_path), capsys)
    assert status == STORAGE_REFUSED, err
    assert f"no such bucket for bucket {bucket}" in err, err
