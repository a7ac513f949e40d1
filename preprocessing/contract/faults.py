"""Transient or permanent: the one retry policy and error classification of ballast's reads.

A fault may cost time, never data. Every read of a reshard (the listing, the scan of a
file, the id check, the map task's read of a piece, the reduce task's reads of staged
pieces) and of batch inference runs through `call_with_retries`, which retries what may
pass with exponential backoff and jitter, and stops at once on what cannot:

- permanent: `PermanentInputError`, raised only on positive evidence that the input
  itself is bad. `CorruptInput`: every byte the store holds was read in full (the reader
  checks each read against the object's size) and pyarrow cannot decode it: a corrupt
  or truncated file. `preprocessing.scan.feature_stats.InputError`: the rows break a rule of the
  dataset. Retrying reads the same bytes again.
- transient: everything else. An S3 503 SlowDown or 500, a connection reset, a timeout,
  a body cut short (`TruncatedRead`, or the HTTP client's own length check), a missing
  file, and any kind of error this module does not know.

A file is rejected from a version only for a permanent error; a file still unreadable
for a transient one after every attempt fails the run, so no version is committed
without it (docs/reliability.md). The storage clients retry single requests below this
(s3fs five times per call, botocore per `AWS_MAX_ATTEMPTS`); this policy re-opens and
re-reads the whole file or task.
"""

from __future__ import annotations

import functools
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

# What pyarrow raises when bytes do not decode (a corrupt page is a plain OSError, e.g.
# "Couldn't deserialize thrift"); a store's own errors pass through pyarrow unchanged.
DECODE_ERRORS: tuple[type[BaseException], ...] = (
    pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError, pa.ArrowKeyError,
    pa.ArrowIndexError, pa.ArrowSerializationError, OSError)


class PermanentError(Exception):
    """Trying again cannot change the outcome (bad input, a dataset that disagrees with
    its manifest): every retry loop stops at once on it."""


class PermanentInputError(PermanentError, ValueError):
    """The input itself is bad: reading it again cannot change the outcome."""


class CorruptInput(PermanentInputError):
    """A file read in full whose bytes pyarrow cannot decode (corrupt or truncated)."""


class TruncatedRead(OSError):
    """A read returned fewer bytes than the object holds from that offset: the body was
    cut short on the way (transient), not a short file."""


class RetryPolicy(BaseModel):
    """How often and how patiently a read that failed for a transient reason is retried."""

    model_config = ConfigDict(extra="forbid")

    attempts: int = Field(
        5, ge=1, description="Tries of one file or task in all; after the last, a transient "
        "error fails the run (nothing is committed), it never rejects the file.")
    first_delay_s: float = Field(
        0.5, ge=0, description="Wait before the second try; doubled before each later one.")
    max_delay_s: float = Field(8.0, ge=0, description="Longest wait between two tries.")


def is_permanent(error: BaseException) -> bool:
    """Whether `error` says the input itself is bad (or a dataset disagrees with its
    manifest, which no retry changes); any other error may pass."""
    return isinstance(error, PermanentError)


def backoff_s(policy: RetryPolicy, attempt: int) -> float:
    """The wait after failed try `attempt` (1-based): exponential, with jitter so that
    workers throttled together do not retry together."""
    ceiling = min(policy.max_delay_s, policy.first_delay_s * 2 ** (attempt - 1))
    return ceiling * random.uniform(0.5, 1.0)


def call_with_retries(action: Callable[..., T], *args: Any, policy: RetryPolicy,
                      **kwargs: Any) -> T:
    """`action(*args, **kwargs)`, tried again after a transient error up to
    `policy.attempts` times in all; a permanent error, or the last transient one, is
    raised as it came (with a note saying how many tries it took)."""
    for attempt in range(1, policy.attempts + 1):
        try:
            return action(*args, **kwargs)
        except Exception as error:
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
