"""What `loader.balance: speed` learned, remembered for the next job on the same hosts.

One file, `balance_split.json` at the top of the output dir, shared on purpose by every
run of that output dir (`TrainConfig.shared_output_dir`, above each run's `runs/<run_key>`;
not one run's state): {"splits": {key: shares}, "learned": {key: entry}}, the key the
world size and every rank's host name in rank order ("2@node-a,node-b"). A job on the
same hosts starts from its split (training/data/balance.py, `SharePlan.remembered`); one
on other hosts, or another world size, has no entry and starts from equal. A machine's
ranks are slow in their own way, so a split learned elsewhere would be a guess.

The learned entry is the controller's last reading (training/data/speed_control.py): the
points its step model was fitted to, each rank's cost a row at each split it ran, with
the timing noise and the ranks' spread. A job that starts with them (`SharePlan.learned`)
knows what the split costs at once: from a split alone it would first move as if fixed
costs were none and fit anew from two noisy intervals, walking away from the split it
was given (benchmarks/RESULTS.md M91). The points hold only for the global batch they
were measured at (a step's fixed cost is spread over its rows), so they are kept with it
and read only at it; a change of speed since (another model, a quieter host) shows in the
first intervals as a shift, and the controller starts over from them as in any run.

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
import math
from typing import Any

import numpy as np
from fsspec.core import url_to_fs

from preprocessing.contract.manifest import file_lock, is_local, write_atomically
from training.data.speed_change import HISTORY
from training.data.speed_control import PROBE_AFTER, Reading
from training.data.step_model import Point, fit

FILE_NAME = "balance_split.json"
SECTIONS = ("splits", "learned")
log = logging.getLogger(__name__)


def split_key(hosts: list[str]) -> str:
    """The file's key for a job whose rank r runs on hosts[r]."""
    return f"{len(hosts)}@{','.join(hosts)}"


def split_path(output_dir: str) -> str:
    return f"{output_dir.rstrip('/')}/{FILE_NAME}"


def remembered(
    output_dir: str, hosts: list[str], global_batch: int
) -> tuple[np.ndarray | None, Reading | None]:
    """The split and the controller's reading remembered for `hosts`, from one read of
    the file (see `remembered_split`, `remembered_reading`)."""
    data = _read(output_dir)
    return _split_of(data, hosts), _reading_of(data, hosts, global_batch)


def remembered_split(output_dir: str, hosts: list[str]) -> np.ndarray | None:
    """The shares remembered for `hosts`, or None (no file, no entry, or not one share
    > 0 a rank summing to 1)."""
    return _split_of(_read(output_dir), hosts)


def remembered_reading(output_dir: str, hosts: list[str], global_batch: int) -> Reading | None:
    """The controller's reading learned on `hosts` at `global_batch` rows a step, or None
    (none kept, another global batch, or not such an entry: it is then not trusted)."""
    return _reading_of(_read(output_dir), hosts, global_batch)


def _split_of(data: dict[str, dict[str, Any]], hosts: list[str]) -> np.ndarray | None:
    return _shares(data["splits"].get(split_key(hosts)), len(hosts))


def _reading_of(
    data: dict[str, dict[str, Any]], hosts: list[str], global_batch: int
) -> Reading | None:
    entry: Any = data["learned"].get(split_key(hosts))
    try:
        return _reading(entry, len(hosts)) if entry["global_batch"] == global_batch else None
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _reading(entry: dict[str, Any], world: int) -> Reading | None:
    """The reading a kept entry holds, at its newest point's shares (see the module)."""
    found = [_point(point, world) for point in entry["points"][-HISTORY:]]
    points = tuple(point for point in found if point is not None)
    noise, pooled, dispersion = float(entry["noise"]), int(entry["pooled"]), entry["dispersion"]
    spread = None if dispersion is None else np.asarray(dispersion, np.float64)
    if not points or len(points) < len(found) or not (math.isfinite(noise) and noise >= 0):
        return None
    if pooled < 0 or (spread is not None and (spread.shape != (world,) or not _finite(spread, 0))):
        return None
    shares = points[-1].shares
    return Reading(shares, shares, fit(points), points, 0, PROBE_AFTER, pooled, noise, spread)


def learned_entry(reading: Reading, global_batch: int) -> dict[str, Any]:
    """`reading` as the file keeps it (see `remembered_reading`)."""
    points = [[_floats(p.shares), _floats(p.costs), p.weight] for p in reading.history]
    spread = None if reading.dispersion is None else _floats(reading.dispersion)
    return {
        "global_batch": global_batch,
        "points": points,
        "noise": reading.noise,
        "pooled": reading.pooled,
        "dispersion": spread,
    }


def _floats(values: np.ndarray) -> list[float]:
    return [float(value) for value in values]


def remember_split(
    output_dir: str, hosts: list[str], shares: np.ndarray, learned: dict[str, Any] | None = None
) -> None:
    """Record `shares` (and the `learned` entry, if any) for `hosts`, keeping every other
    key's entries (see the module)."""
    fs, path = url_to_fs(split_path(output_dir))
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    if not is_local(fs):
        _write(fs, path, output_dir, hosts, (shares, learned))
        return
    with file_lock(f"{path}.lock"):
        _write(fs, path, output_dir, hosts, (shares, learned))


def _write(
    fs: Any,
    path: str,
    output_dir: str,
    hosts: list[str],
    entries: tuple[np.ndarray, dict[str, Any] | None],
) -> None:
    key, (shares, learned), content = split_key(hosts), entries, _read(output_dir)
    content["splits"][key] = [float(share) for share in shares]
    if learned is not None:
        content["learned"][key] = learned
    write_atomically(fs, path, json.dumps(content, indent=1).encode())


def _shares(found: Any, world: int) -> np.ndarray | None:
    """`found` as one share > 0 a rank summing to 1, or None."""
    if not isinstance(found, list) or len(found) != world:
        return None
    try:
        shares = np.asarray(found, np.float64)
    except (TypeError, ValueError):
        return None
    if shares.shape != (world,) or not (
        np.all(shares > 0) and abs(float(shares.sum()) - 1.0) <= 1e-6
    ):
        return None
    return shares


def _point(found: Any, world: int) -> Point | None:
    """A kept point ([shares, costs, weight]) if it is one, else None."""
    shares, costs, weight = found
    share_array, cost_array = _shares(shares, world), np.asarray(costs, np.float64)
    if share_array is None or cost_array.shape != (world,) or not _finite(cost_array, 1e-300):
        return None
    weight = float(weight)
    return Point(share_array, cost_array, weight) if math.isfinite(weight) and weight >= 1 else None


def _finite(values: np.ndarray, least: float) -> bool:
    return bool(np.all(np.isfinite(values)) and np.all(values >= least))


def _read(output_dir: str) -> dict[str, dict[str, Any]]:
    """The file's sections ("splits", "learned"), each its entries by key; a section is
    empty when the file is absent, not such a file, or lacks it."""
    fs, path = url_to_fs(split_path(output_dir))
    try:
        data = json.loads(fs.cat_file(path))
    except FileNotFoundError:
        data = {}
    except (ValueError, UnicodeDecodeError):
        log.warning("%s is not a balance split file; starting from the equal split", path)
        data = {}
    found = data if isinstance(data, dict) else {}
    return {
        section: dict(entries) if isinstance(entries := found.get(section), dict) else {}
        for section in SECTIONS
    }
