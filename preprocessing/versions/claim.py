"""The claim of a dead attempt on an object store, where no rename is atomic.

On a local root a rerun claims a dead attempt (preprocessing/versions/attempt.py) by
renaming its directory to its own attempt id: of two reruns one rename succeeds. S3 has
no rename (a copy per object, not atomic), so there a rerun claims the attempt with one
conditional PUT (`If-None-Match: *`) of a claim object named after the lease it found
expired:

    <root>/_staging/<version_id>/<attempt_id>/_CLAIM-<sha256 of that lease, 16 digits>

S3 decides a conditional PUT atomically (412 Precondition Failed for every writer but
the first), and moto's server and s3fs (through botocore) both support it; the version
commit already relies on it (`write_atomically(only_if_absent=True)`). Every rerun that
judged the attempt dead read the same lease, so they race for the same key and exactly
one wins; the winner then writes its own lease there, and a rerun that reads the lease
after that finds it fresh, so never claims. When the winner dies in turn, its lease
expires, and the next claim is named after that lease: a new key, which one rerun again
wins. The alternative without conditional writes, a lease with an expiry written and
read back after a pause, only narrows the race (two reruns that both read their own
lease back both proceed); it is not used.

A holder that only stalled (a paused host) past the lease's expiry while a rerun claimed
its attempt does not run on beside it for long: every heartbeat on an object store
first reads the lease back (one GET per HEARTBEAT_S), and one naming another holder
means the attempt was taken over: the stalled run stops renewing and leaves the staging
to the new holder, neither releasing nor removing it (`taken_over`). Until that
heartbeat both may write; every staged object and shard of one version is the same
bytes under the same key whoever writes it, and the version commit is a compare-and-swap,
so that costs work, never a wrong version.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from preprocessing.storage.objects import write_atomically

CLAIM_PREFIX = "_CLAIM-"


def claim_name(lease: dict[str, Any]) -> str:
    """The name of the claim of an attempt whose (expired) lease is `lease`."""
    digest = hashlib.sha256(json.dumps(lease, sort_keys=True).encode()).hexdigest()
    return f"{CLAIM_PREFIX}{digest[:16]}"


def claim_on_store(fs: Any, attempt: str, lease: dict[str, Any], claimant: bytes) -> bool:
    """Whether this run won the attempt at `attempt`, found dead with `lease`: the one
    conditional PUT of its claim that succeeded (`claimant`: the claim's body, for a
    reader). False for every other, and for a store that refused the PUT."""
    try:
        write_atomically(fs, f"{attempt}/{claim_name(lease)}", claimant, only_if_absent=True)
    except OSError:  # 412: another rerun claimed it first (FileExistsError), or a failure
        return False
    return True
