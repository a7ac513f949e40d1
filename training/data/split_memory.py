"""The split `loader.balance: speed` learned, remembered for the next job on the same hosts.

One file, `balance_split.json` at the top of the output dir, shared on purpose by every
run of that output dir (`TrainConfig.shared_output_dir`, above each run's `runs/<run_key>`;
not one run's state): {"splits": {key: shares}}, the key the world
size and every rank's host name in rank order ("2@node-a,node-b"). A job on the same
hosts starts from its entry (training/data/balance.py, `SharePlan.remembered`); one on
other hosts, or another world size, has no entry and starts from equal. A machine's
ranks are slow in their own way, so a split learned elsewhere would be a guess.

Two runs may write at once: on local disk each write holds a host-wide lock beside the
file while it reads, updates its own key and replaces the file atomically, so neither
run's entry is lost and no reader sees half a file; on an object store each write is one
PUT of the whole file (readers see the old one or the new one; of two writers at the
same moment the last one's file stands). A file that cannot be read as such (damaged,
hand-edited) is not trusted: the job starts from equal and the next write replaces it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import file_lock, is_local, write_atomically

FILE_NAME = "balance_split.json"
log = logging.getLogger(__name__)


def split_key(hosts: list[str]) -> str:
    """The file's key for a job whose rank r runs on hosts[r]."""
    return f"{len(hosts)}@{','.join(hosts)}"


def split_path(output_dir: str) -> str:
    return f"{output_dir.rstrip('/')}/{FILE_NAME}"


def remembered_split(output_dir: str, hosts: list[str]) -> np.ndarray | None:
    """The shares remembered for `hosts`, or None (no file, no entry, or not one share
    > 0 a rank summing to 1)."""
    found = _read(output_dir).get(split_key(hosts))
    if not isinstance(found, list) or len(found) != len(hosts):
        return None
    try:
        shares = np.asarray(found, np.float64)
    except (TypeError, ValueError):
        return None
    if shares.shape != (len(hosts),) or not (
        np.all(shares > 0) and abs(float(shares.sum()) - 1.0) <= 1e-6
    ):
        return None
    return shares


def remember_split(output_dir: str, hosts: list[str], shares: np.ndarray) -> None:
    """Record `shares` for `hosts`, keeping every other key's entry (see the module)."""
    fs, path = url_to_fs(split_path(output_dir))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if not is_local(fs):
        _write(fs, path, output_dir, hosts, shares)
        return
    with file_lock(f"{path}.lock"):
        _write(fs, path, output_dir, hosts, shares)


def _write(fs: Any, path: str, output_dir: str, hosts: list[str], shares: np.ndarray) -> None:
    splits = _read(output_dir) | {split_key(hosts): [float(share) for share in shares]}
    write_atomically(fs, path, json.dumps({"splits": splits}, indent=1).encode())


def _read(output_dir: str) -> dict[str, Any]:
    """The file's splits by key; none when it is absent or not such a file."""
    fs, path = url_to_fs(split_path(output_dir))
    try:
        data = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        return {}
    except (ValueError, UnicodeDecodeError):
        log.warning("%s is not a balance split file; starting from the equal split", path)
        return {}
    splits = data.get("splits") if isinstance(data, dict) else None
    return splits if isinstance(splits, dict) else {}
