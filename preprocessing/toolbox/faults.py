"""The one error taxonomy and the one retry policy of ballast: every layer raises these
kinds, every retry loop reads them.

Three kinds, by what fixes them (`classify`):
- transient (`TransientError`, and any error this module does not know): an S3 503
  SlowDown or 500, a connection reset, a timeout, a body cut short (`TruncatedRead`), a
  missing file, a server that does not answer. Trying again later may pass: retried.
- permanent (`PermanentError`): trying again cannot change the outcome. Bad input
  (`PermanentInputError`: `CorruptInput`, every byte read in full and pyarrow cannot
  decode it; the rows break a rule of the dataset), a dataset that disagrees with its
  manifest, a commit another run won, and storage that refuses for a reason only a
  person fixes (`StorageRefused`: no space left, quota exceeded, permission denied, a
  read-only file system; an OSError is classed by its errno, an S3 error by its code).
- config (`ConfigError`, and any `ValueError` of ballast's own checks or pydantic's
  validation, but not pyarrow's, which a truncated read raises too): the job as asked
  for is wrong; it fails the same way every time, so it is never retried either.

`call_with_retries` retries only the transient kind, with exponential backoff and
jitter, under one `RetryPolicy`; the launcher retries a training job under the same
type (training/launch/job.py), and Prefect tasks read `classify` too (flows/tasks.py).
Which level retries which operation: docs/reliability.md, "Who retries what".

A file is rejected from a version only for a `PermanentInputError`; a file still
unreadable for a transient reason after every attempt fails the run, so no version is
committed without it (docs/reliability.md). The storage clients retry single requests
below this (s3fs five times per call, botocore per `AWS_MAX_ATTEMPTS`); this policy
re-opens and re-reads the whole file or task.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import random
import re
import shutil
import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, model_validator

T = TypeVar("T")
ErrorKind = Literal["transient", "permanent", "config"]

# What pyarrow raises when bytes do not decode (a corrupt page is a plain OSError, e.g.
# "Couldn't deserialize thrift"); a store's own errors pass through pyarrow unchanged.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    pa.ArrowInvalid,
    pa.ArrowNotImplementedError,
    pa.ArrowTypeError,
    pa.ArrowKeyError,
    pa.ArrowIndexError,
    pa.ArrowSerializationError,
    OSError,
)

# errno -> what a person reads: the storage refused, and waiting does not change that.
REFUSING_ERRNOS = {
    errno.ENOSPC: "no space left on",
    errno.EDQUOT: "disk quota exceeded on",
    errno.EACCES: "permission denied on",
    errno.EPERM: "operation not permitted on",
    errno.EROFS: "read-only file system at",
}
# The same refusals as S3 (and S3-compatible stores) name them in an error's code.
REFUSING_S3_CODES = {
    "AccessDenied": "permission denied on",
    "AllAccessDisabled": "permission denied on",
    "InvalidAccessKeyId": "unknown access key for",
    "SignatureDoesNotMatch": "wrong secret key for",
    "AccountProblem": "account blocked for",
    "QuotaExceeded": "quota exceeded on",
    "ServiceQuotaExceededException": "quota exceeded on",
    "NoSuchBucket": "no such bucket for",
}
_ERRNO_IN_TEXT = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)  # pyarrow's "Detail: [errno 28]"


class TransientError(Exception):
    """Trying again later may pass (a server that did not answer, a body cut short)."""


class PermanentError(Exception):
    """Trying again cannot change the outcome (bad input, a dataset that disagrees with
    its manifest, storage that refuses): every retry loop stops at once on it."""


class RetriesExhausted(PermanentError):
    """Transient errors outlasted the retries of the one level that retries this
    operation: no level above tries it again (a rerun, by a person or a schedule, does)."""


class ConfigError(PermanentError, ValueError):
    """The job as configured is wrong (a field, a flag, a preset): fix the config."""


class PermanentInputError(PermanentError, ValueError):
    """The input itself is bad: reading it again cannot change the outcome."""


class CorruptInput(PermanentInputError):
    """A file read in full whose bytes pyarrow cannot decode (corrupt or truncated)."""


class TruncatedRead(TransientError, OSError):
    """A read returned fewer bytes than the object holds from that offset: the body was
    cut short on the way (transient), not a short file."""


class StorageRefused(PermanentError, OSError):
    """Storage refused for a reason only a person fixes: no space, quota, permission, a
    read-only file system. `errno` is the refusal's; the message names the path and,
    for no space, the bytes needed and free where known."""

    def __init__(self, code: int | None, message: str, path: str | None = None) -> None:
        super().__init__(code, message, path)
        self.message = message

    def __str__(self) -> str:
        return self.message


class RetryPolicy(BaseModel):
    """How often and how patiently an operation that failed for a transient reason is
    tried again: a read of a reshard or of batch inference, a training job's attempt."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(
        5,
        ge=1,
        description="Tries in all (1 never retries); after the last, a transient "
        "error fails the operation (a reshard commits nothing, it never rejects the file).",
    )
    first_delay_s: float = Field(
        0.5, ge=0, description="Wait before the second try; doubled before each later one."
    )
    max_delay_s: float = Field(8.0, ge=0, description="Longest wait between two tries.")

    @model_validator(mode="before")
    @classmethod
    def refuse_old_names(cls, data: Any) -> Any:
        """The launcher's former policy named its first wait `backoff_s`."""
        if isinstance(data, dict) and "backoff_s" in data:
            raise ValueError(
                "retry.backoff_s is now retry.first_delay_s (each later wait "
                "doubles, up to retry.max_delay_s): preprocessing/contract/"
                "faults.py RetryPolicy"
            )
        return data


def error_errno(error: BaseException) -> int | None:
    """The OS error number of `error`, also where pyarrow left it only in the text, or
    s3fs gave a PermissionError none (its translation of S3's AccessDenied)."""
    if not isinstance(error, OSError):
        return None
    if error.errno is not None:
        return int(error.errno)
    found = _ERRNO_IN_TEXT.search(str(error))
    if found:
        return int(found.group(1))
    return errno.EACCES if isinstance(error, PermissionError) else None


def s3_error_code(error: BaseException) -> str | None:
    """The error code of a botocore ClientError (read from its response, so that this
    module needs no S3 client), also behind the OSError s3fs translates it into."""
    for candidate in (error, error.__cause__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code"):
            return str(response["Error"]["Code"])
    return None


def _bucket_of(error: BaseException) -> str | None:
    """`bucket <name>` when an S3 error names its bucket (NoSuchBucket does), else None."""
    for candidate in (error, error.__cause__):
        response = getattr(candidate, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("BucketName"):
            return f"bucket {response['Error']['BucketName']}"
    return None


def storage_refusal(
    error: BaseException, path: str | None = None, needed_bytes: int | None = None
) -> StorageRefused | None:
    """`error` as the StorageRefused it is (naming `path`, or the path the error names),
    or None when it is not a refusal of the storage."""
    if isinstance(error, StorageRefused):
        return error
    code = error_errno(error)
    what = REFUSING_ERRNOS.get(code) if code is not None else None
    if what is None:
        what = REFUSING_S3_CODES.get(s3_error_code(error) or "")
    if what is None:
        return None
    where = path or getattr(error, "filename", None) or _bucket_of(error) or "an unnamed path"
    message = f"{what} {where}"
    if code == errno.ENOSPC:
        message += space_needed(str(where), needed_bytes)
    return StorageRefused(code, f"{message} ({type(error).__name__}: {error})", str(where))


def space_needed(path: str, needed_bytes: int | None) -> str:
    """ ": N bytes needed, M free" as far as they are known (the free space of a local
    path's nearest existing directory; an object store's is not known)."""
    parts = [f"{needed_bytes} bytes needed"] if needed_bytes is not None else []
    if "://" not in path or path.startswith("file://"):
        directory = os.path.abspath(path.removeprefix("file://"))
        while not os.path.isdir(directory) and directory != os.path.dirname(directory):
            directory = os.path.dirname(directory)
        with contextlib.suppress(OSError):
            parts.append(f"{shutil.disk_usage(directory).free} free")
    return f": {', '.join(parts)}" if parts else ""


def classify(error: BaseException) -> ErrorKind:
    """transient, permanent or config (see the module); an unknown kind is transient."""
    if isinstance(error, ConfigError):
        return "config"
    if isinstance(error, PermanentError) or storage_refusal(error) is not None:
        return "permanent"
    if isinstance(error, TransientError | pa.ArrowException):
        return "transient"  # pyarrow's ArrowInvalid is a ValueError that a cut read raises
    return "config" if isinstance(error, ValueError) else "transient"


def is_permanent(error: BaseException) -> bool:
    """Whether no retry can change the outcome (permanent or config)."""
    return classify(error) != "transient"


def backoff_s(policy: RetryPolicy, attempt: int) -> float:
    """The wait after failed try `attempt` (1-based): exponential, with jitter so that
    workers throttled together do not retry together."""
    ceiling = min(policy.max_delay_s, policy.first_delay_s * 2 ** (attempt - 1))
    return ceiling * random.uniform(0.5, 1.0)


def call_with_retries(
    action: Callable[..., T], *args: Any, policy: RetryPolicy, **kwargs: Any
) -> T:
    """`action(*args, **kwargs)`, tried again after a transient error up to
    `policy.attempts` times in all; a permanent error, or the last transient one, is
    raised (a storage refusal as StorageRefused) with a note saying how many tries it
    took."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return action(*args, **kwargs)
        except Exception as error:
            refusal = storage_refusal(error)
            if refusal is not None and refusal is not error:
                refusal.add_note(f"(failed on try {attempt} of {policy.attempts}; not retried)")
                raise refusal from error
            if is_permanent(error) or attempt == policy.attempts:
                error.add_note(f"(failed on try {attempt} of {policy.attempts})")
                raise
            time.sleep(backoff_s(policy, attempt))
    raise AssertionError("unreachable: policy.attempts >= 1")


def retrying(action: Callable[..., T], policy: RetryPolicy) -> Callable[..., T]:
    """`action` under `call_with_retries`, as a picklable callable (a Dask task)."""
    retried = functools.partial(call_with_retries, action, policy=policy)
    functools.update_wrapper(retried, action)  # Dask names the task after `action`
    return retried
