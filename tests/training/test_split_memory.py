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
from training.data.speed_control import equal_shares
from training.data.split_memory import (
    FILE_NAME,
    remember_split,
    remembered_split,
    split_key,
)

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
