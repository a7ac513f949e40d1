"""Whether an object store's endpoint answers at all, asked once and quickly before the
first real request to it.

An S3 endpoint that is down took 11-58 s to say so (issue 38): the listing of an input
root is retried under `reshard.retry`, each try by s3fs (5 calls) and each call by
botocore (`AWS_MAX_ATTEMPTS`), with backoff at every level. Those retries suit a transfer
that a blip interrupts, not a first contact with an endpoint that is not there.
`check_reachable` sends one unsigned HEAD of the bucket with PROBE_TIMEOUT_S to connect
and to answer and no retry: any answer, an error response included (403, 404), means the
endpoint is there and the real requests go on under the normal retry policy. No answer
raises `EndpointUnreachable` (exit 4: rerun once it answers) naming the endpoint and
the setting it came from; a 404 (no such bucket) raises StorageRefused (exit 5) naming
the bucket. A bucket whose endpoint answered is not asked again in this process.
Every S3 URI a command is given goes through it before its first real request: the
config file (`python -m preprocessing`, `ballast run`), the inputs, the output root (and
`ballast verify`'s root), so each fails the same way, with the same exit status.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import botocore.session
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as EndpointError
from fsspec.core import url_to_fs

from preprocessing.toolbox.faults import RetriesExhausted, StorageRefused
from preprocessing.toolbox.secrets import redact

PROBE_TIMEOUT_S = 3.0
S3_PROTOCOLS = ("s3://", "s3a://")
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")  # botocore's order
_answered: set[tuple[str, str]] = set()  # (endpoint, bucket) that answered in this process
_NO_BUCKET = ("404", "NoSuchBucket")


class EndpointUnreachable(RetriesExhausted):
    """An object store's endpoint gave no answer at all to a first request."""


def check_reachable(uris: Iterable[str]) -> None:
    """Probe the endpoint of every S3 URI among `uris` (see the module); other stores
    are left to their first request."""
    for uri in uris:
        if uri.startswith(S3_PROTOCOLS):
            probe_s3(uri)


def probe_s3(uri: str) -> None:
    """One unsigned HEAD of `uri`'s bucket, no retry; EndpointUnreachable if unanswered."""
    fs, path = url_to_fs(uri)
    explicit, setting = endpoint_setting(fs)
    probe = {"connect_timeout": PROBE_TIMEOUT_S, "read_timeout": PROBE_TIMEOUT_S}
    client = botocore.session.get_session().create_client(
        "s3",
        endpoint_url=explicit,
        config=Config(signature_version=UNSIGNED, retries={"total_max_attempts": 1}, **probe),
    )
    endpoint, bucket = client.meta.endpoint_url, path.split("/", 1)[0]
    if (endpoint, bucket) in _answered:
        return
    try:
        client.head_bucket(Bucket=bucket)
    except (EndpointError, HTTPClientError) as error:
        raise EndpointUnreachable(
            f"S3 endpoint {endpoint} (from {setting}) did not answer within "
            f"{PROBE_TIMEOUT_S:g} s, reaching {redact(uri)} ({type(error).__name__}); "
            f"start it or correct {setting.split(' ', 1)[0]}, then rerun"
        ) from error
    except ClientError as error:  # an answer; only a missing bucket is final already
        if error.response.get("Error", {}).get("Code") in _NO_BUCKET:
            raise StorageRefused(
                None,
                f"no such bucket for bucket {bucket}: {redact(uri)} at S3 endpoint "
                f"{endpoint} (from {setting}); create it or correct the URI",
                f"bucket {bucket}",
            ) from error
    except BotoCoreError:
        pass  # a request botocore would not send: the real requests say more
    _answered.add((endpoint, bucket))


def endpoint_setting(fs: Any) -> tuple[str | None, str]:
    """The endpoint s3fs was given explicitly (None: botocore resolves it, as for s3fs),
    and the setting a person changes to move it."""
    explicit = getattr(fs, "endpoint_url", None) or fs.client_kwargs.get("endpoint_url")
    if explicit:
        return explicit, "endpoint_url of the s3 storage options"
    for name in ENDPOINT_VARIABLES:
        if os.environ.get(name):
            return None, name
    return None, "AWS_ENDPOINT_URL (unset: AWS's endpoint for the region)"
