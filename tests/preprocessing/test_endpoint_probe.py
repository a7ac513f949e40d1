"""A first contact with an S3 endpoint that does not answer fails within seconds, in one
line naming the endpoint and the setting it came from (preprocessing/storage/reach.py);
before, the listing's retries took 11-58 s to say so (issue 38)."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.contract.exit_status import TRANSIENT, cause_line, exit_status
from preprocessing.driver.reshard import list_once
from preprocessing.storage.reach import PROBE_TIMEOUT_S, EndpointUnreachable


@pytest.mark.slow
@pytest.mark.parametrize("listening", [False, True], ids=["closed-port", "never-answers"])
def test_an_endpoint_that_does_not_answer_is_named_within_seconds(
    listening: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: with AWS_ENDPOINT_URL at a closed loopback port, or at one that accepts
    connections and never answers, listing a reshard's inputs fails within the probe's
    timeout plus 5 s (3.6 and 4.6 s here; before: 48.6 s, and nothing within 300 s),
    exit 4, one line naming the endpoint, AWS_ENDPOINT_URL and the input root. Takes
    about 10 s for both."""
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=["s3://ballast-nowhere/raw"], source_column=None),
        output_root=str(tmp_path / "out"),
    )
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        if listening:
            server.listen(8)  # the kernel completes each handshake; nobody ever answers
        else:
            server.close()  # nothing listens there now
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
        started = time.monotonic()
        with pytest.raises(EndpointUnreachable) as caught:
            list_once(config)
        seconds = time.monotonic() - started
    line = cause_line(caught.value)
    assert seconds < PROBE_TIMEOUT_S + 5, f"{seconds:.1f} s: {line}"
    assert exit_status(caught.value) == TRANSIENT
    for named in (f"http://127.0.0.1:{port}", "AWS_ENDPOINT_URL", "s3://ballast-nowhere/raw"):
        assert named in line, line
