"""The route plan (preprocessing/plan/route.py), pure: a reshard takes the single pass
exactly when a positive budget holds what it must hold, and what it must hold covers
every input byte and the largest shard."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from preprocessing.config import ReshardConfig, output_neutral_fields
from preprocessing.plan.route import SINGLE_PASS, STAGED, plan_route

sizes = st.lists(st.integers(0, 1 << 40), max_size=30)


@given(pieces=sizes, shards=sizes, budget=st.integers(0, 1 << 45))
def test_the_single_pass_runs_exactly_when_its_rows_fit_the_budget(pieces, shards, budget) -> None:
    """Invariants: held bytes are at least every piece's bytes plus the largest shard;
    single_pass iff budget > 0 and held <= budget (0 always stages); the record and the
    log line name the route and both figures."""
    route = plan_route(
        np.array(pieces, dtype=np.float64), np.array(shards, dtype=np.float64), budget
    )
    assert route.held_bytes >= sum(pieces) + max(shards, default=0)
    assert route.held_bytes <= sum(pieces) + max(shards, default=0) + 1
    fits = budget > 0 and route.held_bytes <= budget
    assert route.name == (SINGLE_PASS if fits else STAGED)
    assert route.record() == {
        "route": route.name,
        "held_bytes": route.held_bytes,
        "budget_bytes": budget,
    }
    assert route.line().startswith(f"route {route.name}:") and "\n" not in route.line()


def test_the_budget_is_output_neutral_and_unset_by_default() -> None:
    """Invariant: `single_pass_bytes` never enters the version id, and defaults to None
    (an eighth of the host's memory, chosen by the driver)."""
    assert "single_pass_bytes" in output_neutral_fields(ReshardConfig)
    assert ReshardConfig.model_fields["single_pass_bytes"].default is None
