"""Which tests share an xdist worker (tests/parallel.py), on stand-in items: the groups are
what keeps each shared pipeline run and module fixture to one run per suite."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from tests.parallel import group_of, order_items


@dataclass
class Item:
    """The parts of a pytest item that the grouping reads."""

    nodeid: str
    fixtures: dict[str, tuple[str, str]] = field(default_factory=dict)  # name: (scope, baseid)
    markers: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        self.fixturenames = list(self.fixtures)
        defs = {
            name: [SimpleNamespace(scope=s, baseid=b)] for name, (s, b) in self.fixtures.items()
        }
        self._fixtureinfo = SimpleNamespace(name2fixturedefs=defs)

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def grouped(*args: Any, **kwargs: Any) -> str | None:
    return group_of(Item(*args, **kwargs))  # type: ignore[arg-type]


def test_shared_runs_slurm_and_module_fixtures_each_keep_to_one_group() -> None:
    """Invariants: SLURM tests share one group; the readers of each session pipeline run
    share one group per run; a test using a module fixture of its own module is grouped by
    module; a test of function fixtures or of the root conftest's services runs anywhere."""
    services = {"dask_client": ("session", ""), "tmp_path": ("function", "")}
    assert grouped("tests/slurm/a.py::t", markers=("slurm", "slow")) == "slurm"
    assert grouped("tests/flows/a.py::t", {"first_state": ("session", "tests/flows")}) == (
        "pipeline-run"
    )
    assert grouped("tests/b.py::t", {"cli_pipeline_run": ("session", "")}) == "cli-pipeline"
    assert grouped("tests/c.py::t", {"world": ("module", "tests/c.py"), **services}) == (
        "tests/c.py"
    )
    assert grouped("tests/d.py::t", services) is None


def test_groups_and_long_tests_are_handed_out_first_the_quick_tier_last() -> None:
    """Invariant: grouped and long tests come first, then the slow tier, the quick tier
    last; the order within each rank is kept."""
    quick, slow = Item("q.py::a"), Item("s.py::b", markers=("slow",))
    long, in_group = (
        Item("l.py::c[x]", markers=("slow",)),
        Item("g.py::d", markers=("xdist_group",)),
    )
    items = [quick, slow, long, in_group]
    order_items(items, frozenset({"l.py::c"}))  # type: ignore[arg-type]
    assert items == [long, in_group, slow, quick]
