"""The split `speed` learned, remembered in the output dir (training/data/split_memory.py)
and where a stream starts from (training/data/balance.py, `SharePlan`): the same hosts
start from their entry, other hosts or another world size from equal; a checkpoint's
shares count only on the hosts they were learned on; two writers at once lose neither
entry; a damaged file is not trusted, never raised, and replaced by the next write."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training.data.balance import SharePlan
from training.data.speed_control import Reading, equal_shares
from training.data.split_memory import (
    FILE_NAME,
    learned_entry,
    remember_split,
    remembered_reading,
    remembered_split,
    split_key,
)
from training.data.step_model import Point, fit

HOSTS = ["node-a", "node-b"]


def read_back(output_dir: str, hosts: list[str]) -> list[float] | None:
    found = remembered_split(output_dir, hosts)
    return None if found is None else [float(share) for share in found]


def test_a_split_is_remembered_for_its_hosts_and_world_size_only(tmp_path: Path) -> None:
    """Invariant: shares written for (hosts) read back exactly for the same hosts in the
    same rank order; other hosts, the same hosts in another order, or another world size
    have none; the file sits at the top of the output dir, beside the runs."""
    out = str(tmp_path / "out")
    remember_split(out, HOSTS, np.array([0.7, 0.3]))
    assert (tmp_path / "out" / FILE_NAME).exists()
    assert read_back(out, HOSTS) == [0.7, 0.3]
    assert remembered_split(out, ["node-a", "node-c"]) is None
    assert remembered_split(out, list(reversed(HOSTS))) is None
    assert remembered_split(out, ["node-a"] * 4) is None
    remember_split(out, ["node-c"] * 4, equal_shares(4))
    assert read_back(out, HOSTS) == [0.7, 0.3]


def test_writers_at_once_lose_no_entry(tmp_path: Path) -> None:
    """Invariant: 8 writers at once, each rewriting its own hosts' entry 25 times, leave a
    file that reads as JSON with all 8 entries, each its writer's last shares."""
    out = str(tmp_path)

    def writer(index: int) -> None:
        for round_ in range(25):
            share = 0.5 + 0.01 * round_
            remember_split(out, [f"h{index}", "x"], np.array([share, 1 - share]))

    threads = [threading.Thread(target=writer, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    splits = json.loads((tmp_path / FILE_NAME).read_text())["splits"]
    assert sorted(splits) == sorted(split_key([f"h{index}", "x"]) for index in range(8))
    for index in range(8):
        assert remembered_split(out, [f"h{index}", "x"]) == pytest.approx([0.74, 0.26])


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    content=st.one_of(
        st.binary(max_size=40),
        json_values.map(lambda v: json.dumps(v).encode()),
        st.builds(lambda v: json.dumps({"splits": {split_key(HOSTS): v}}).encode(), json_values),
        st.just(json.dumps({"splits": {split_key(HOSTS): [[0.5], [0.5]]}}).encode()),
    )
)
def test_a_damaged_file_is_not_trusted_and_is_replaced(tmp_path: Path, content: bytes) -> None:
    """Invariant: whatever the file holds (bytes, any JSON, any value under the hosts'
    key), reading it never raises and gives either None or one share > 0 a rank summing
    to 1; the next write replaces it with a file that reads back its shares."""
    out = tmp_path / "hostile"
    out.mkdir(exist_ok=True)
    (out / FILE_NAME).write_bytes(content)
    found = remembered_split(str(out), HOSTS)
    if found is not None:
        assert len(found) == 2 and np.all(found > 0) and found.sum() == pytest.approx(1.0)
    remember_split(str(out), HOSTS, np.array([0.6, 0.4]))
    assert read_back(str(out), HOSTS) == [0.6, 0.4]


def test_a_stream_starts_from_the_split_of_its_hosts_and_a_checkpoint_only_on_them() -> None:
    """Invariant: a plan with a remembered split starts from it on its world size (equal on
    another); a checkpoint's shares are taken on the hosts they were saved on, and on
    other hosts the plan starts from the remembered split for these hosts, or equal; a
    checkpoint without hosts (saved before hosts were) counts on its world size; `fixed`
    starts from its own shares whatever was saved or remembered."""
    learned = SharePlan()
    learned.hosts = HOSTS
    learned.load_state({"balance_world_size": 2, "balance_shares": [0.8, 0.2]})
    learned.shares_at(0, 0, 2)
    state = learned.state()
    assert state["balance_hosts"] == HOSTS and state["balance_shares"] == [0.8, 0.2]

    def resumed(hosts: list[str], remembered: list[float] | None = None) -> np.ndarray:
        plan = SharePlan()
        plan.hosts = hosts
        plan.remembered = None if remembered is None else np.array(remembered)
        plan.load_state(state)
        return plan.shares_at(0, 0, 2)

    assert np.array_equal(resumed(HOSTS), [0.8, 0.2])
    assert np.array_equal(resumed(["node-c", "node-d"]), equal_shares(2))
    assert np.array_equal(resumed(["node-c", "node-d"], [0.6, 0.4]), [0.6, 0.4])
    remembered = SharePlan()
    remembered.remembered = np.array([0.6, 0.4])
    assert np.array_equal(remembered.shares_at(0, 0, 2), [0.6, 0.4])
    assert np.array_equal(remembered.shares_at(0, 0, 4), equal_shares(4))
    old = SharePlan()
    old.hosts = HOSTS
    old.load_state({"balance_world_size": 2, "balance_shares": [0.8, 0.2]})
    assert np.array_equal(old.shares_at(0, 0, 2), [0.8, 0.2])
    fixed = SharePlan([0.3, 0.7])
    fixed.remembered = np.array([0.6, 0.4])
    fixed.load_state(state)
    assert np.array_equal(fixed.shares_at(0, 0, 2), [0.3, 0.7])


def learned_reading() -> Reading:
    """A reading as the controller leaves it: three points at two splits, noise, spread."""
    points = (
        Point(np.array([0.5, 0.5]), np.array([2e-5, 3e-5]), 3.0),
        Point(np.array([0.7, 0.3]), np.array([2.6e-5, 2.2e-5]), 15.0),
    )
    shares = points[-1].shares
    return Reading(shares, shares, fit(points), points, 0, 8, 9, 0.02, np.array([1e-6, 4e-6]))


def test_the_learned_reading_is_kept_at_its_global_batch_for_its_hosts(tmp_path: Path) -> None:
    """Invariant: the reading written with a split reads back for the same hosts at the
    same global batch with the same points, noise, pooled count, spread and a fitted
    model; at another global batch, or for other hosts, there is none; a split written
    later without a reading keeps the reading; another key's write keeps both."""
    out, reading = str(tmp_path), learned_reading()
    remember_split(out, HOSTS, np.array([0.7, 0.3]), learned_entry(reading, 512))
    found = remembered_reading(out, HOSTS, 512)
    assert found is not None and found.fitted and not found.moves()
    assert [(p.shares.tolist(), p.costs.tolist(), p.weight) for p in found.history] == [
        (p.shares.tolist(), p.costs.tolist(), p.weight) for p in reading.history
    ]
    assert (found.noise, found.pooled) == (0.02, 9)
    assert found.dispersion is not None and found.dispersion.tolist() == [1e-6, 4e-6]
    assert remembered_reading(out, HOSTS, 256) is None
    assert remembered_reading(out, ["node-a", "node-c"], 512) is None
    remember_split(out, HOSTS, np.array([0.6, 0.4]))
    remember_split(out, ["node-c", "node-d"], np.array([0.5, 0.5]))
    assert remembered_reading(out, HOSTS, 512) is not None
    assert read_back(out, HOSTS) == [0.6, 0.4]


point_values = st.lists(
    st.one_of(json_values, st.floats(), st.lists(st.floats(), min_size=2, max_size=2)),
    min_size=3,
    max_size=3,
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entry=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {
                "global_batch": st.sampled_from([512, 256]) | json_values,
                "points": st.lists(point_values, max_size=3) | json_values,
                "noise": st.floats() | json_values,
                "pooled": st.integers(-3, 20) | json_values,
                "dispersion": st.none() | st.lists(st.floats(), max_size=3) | json_values,
            }
        ),
    )
)
def test_a_damaged_learned_entry_is_not_trusted(tmp_path: Path, entry: object) -> None:
    """Invariant: whatever the hosts' learned entry holds, reading it never raises and
    gives None or a reading whose every point has one share > 0 a rank summing to 1 and
    finite costs > 0, with finite noise >= 0 and a spread of finite values >= 0, a rank."""
    out = tmp_path / "hostile-learned"
    out.mkdir(exist_ok=True)
    content = {"splits": {split_key(HOSTS): [0.5, 0.5]}, "learned": {split_key(HOSTS): entry}}
    (out / FILE_NAME).write_text(json.dumps(content))
    found = remembered_reading(str(out), HOSTS, 512)
    if found is None:
        return
    for point in found.history:
        assert point.shares.shape == (2,) and np.all(point.shares > 0)
        assert point.shares.sum() == pytest.approx(1.0)
        assert np.all(np.isfinite(point.costs)) and np.all(point.costs > 0) and point.weight >= 1
    assert np.isfinite(found.noise) and found.noise >= 0 and found.pooled >= 0
    if found.dispersion is not None:
        assert found.dispersion.shape == (2,) and np.all(np.isfinite(found.dispersion))
        assert np.all(found.dispersion >= 0)
