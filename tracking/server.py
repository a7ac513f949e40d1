"""Whether the tracking server can be reached, and which of its errors mean "try later".

Only an HTTP tracking server can be down: a local store (`sqlite:///...`) is a file, and its
errors are real errors. For a server, an error is permanent only when the server answered
that the request itself is wrong (a 4xx other than "too many requests"); a refused
connection, a timeout, a 5xx, or MLflow's "API request ... failed" are transient: what
could not be sent is kept on local disk (tracking/run/spool.py) and sent later.
"""

from __future__ import annotations

import base64
import os
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse, urlunparse

from mlflow.exceptions import MlflowException, RestException

from preprocessing.toolbox.faults import TransientError, classify
from preprocessing.toolbox.secrets import split_credentials

PROBE_TIMEOUT_S = 5.0
_RETRY_CODES = {"REQUEST_LIMIT_EXCEEDED", "TEMPORARILY_UNAVAILABLE"}
# uri -> when a wait for it last ran out: waits soon after probe once only, so a job's end
# (last metrics, system metrics, the model) waits for a down server once, not thrice.
_gave_up_at: dict[str, float] = {}
_WAIT_AGAIN_AFTER_S = 600.0


class TrackingUnavailable(TransientError, RuntimeError):
    """The tracking server could not be reached (it may be back later)."""


def is_server(tracking_uri: str) -> bool:
    """An HTTP(S) tracking server, as opposed to a local store."""
    return urlparse(tracking_uri).scheme in ("http", "https")


def without_credentials(tracking_uri: str) -> str:
    """The URI with no user or password at all (a link a person can click)."""
    parts = urlparse(tracking_uri)
    return urlunparse(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def is_reachable(tracking_uri: str) -> bool:
    """True for a local store; for a server, whether it answers HTTP at all (any answer
    below 500 counts: a 401 behind authentication is a server that is up)."""
    if not is_server(tracking_uri):
        return True
    probe = urllib.request.Request(
        f"{without_credentials(tracking_uri).rstrip('/')}/health",
        headers=auth_headers(tracking_uri),
    )
    try:
        with urllib.request.urlopen(probe, timeout=PROBE_TIMEOUT_S):
            return True
    except urllib.error.HTTPError as answer:
        return answer.code < 500
    except OSError:
        return False


def auth_headers(tracking_uri: str) -> dict[str, str]:
    """Basic auth from the URI's user and password, else MLflow's own variables, so the
    probe authenticates as the client does (no unauthenticated request from ballast)."""
    _, user, password = split_credentials(tracking_uri)
    if user is None:
        user = os.environ.get("MLFLOW_TRACKING_USERNAME")
        password = os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if not user or password is None:
        return {}
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def wait_until_reachable(tracking_uri: str, wait_s: float) -> bool:
    """Probe the server for up to `wait_s` (once only, if a wait ran out lately)."""
    if is_reachable(tracking_uri):
        _gave_up_at.pop(tracking_uri, None)
        return True
    recently = time.monotonic() - _gave_up_at.get(tracking_uri, -_WAIT_AGAIN_AFTER_S)
    deadline = time.monotonic() + (0.0 if recently < _WAIT_AGAIN_AFTER_S else wait_s)
    while time.monotonic() < deadline:
        time.sleep(min(2.0, max(0.0, deadline - time.monotonic())))
        if is_reachable(tracking_uri):
            _gave_up_at.pop(tracking_uri, None)
            return True
    _gave_up_at[tracking_uri] = time.monotonic()
    return False


def is_transient(error: BaseException) -> bool:
    """Whether sending again later may succeed (see the module docstring); what the one
    taxonomy (preprocessing/toolbox/faults.py) calls permanent or config never is: a
    full disk or a refused permission under the artifact store waits for a person."""
    if isinstance(error, RestException):
        return error.get_http_status_code() >= 500 or error.error_code in _RETRY_CODES
    if classify(error) != "transient":
        return False
    return isinstance(error, MlflowException | OSError | TransientError) or _is_transient_s3(error)


def _is_transient_s3(error: BaseException) -> bool:
    """An artifact store on S3 (boto) failing to connect, or answering 5xx / SlowDown."""
    try:
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:  # no S3 client installed: no S3 artifact store either
        return False
    if isinstance(error, ClientError):
        return int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 500)) >= 500
    return isinstance(error, BotoCoreError)
