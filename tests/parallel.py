"""How the suite shares its work between pytest-xdist workers (`make test`: `-n 3 --dist
loadgroup`). Each worker is a pytest session of its own, so a session or module fixture runs
once per worker that asks for it; the tests that share a costly one go to one worker, as a
group (an `xdist_group` mark, added here at collection):

- the SLURM tests, which share the one-host cluster's 2 CPUs (a job of one would wait for
  the other's), in one group;
- the readers of a session pipeline run (`cli_pipeline_run`, `first_state`), one group each;
- the tests of a module that defines a module- or session-scoped fixture, one group per
  module.

The groups and the known long tests start first: the longest work begins while the short
tests fill the other workers, instead of one pipeline run starting last and the rest
waiting for it. Without xdist the marks do nothing; the order within a module stays as
written."""

from __future__ import annotations

import pytest

# Session fixtures whose one run is read by tests of several modules.
SHARED_RUNS = {"cli_pipeline_run": "cli-pipeline", "first_state": "pipeline-run"}


def group_of(item: pytest.Item) -> str | None:
    """The xdist group `item` runs in, or None (any worker)."""
    if item.get_closest_marker("slurm") is not None:
        return "slurm"
    for fixture, group in SHARED_RUNS.items():
        if fixture in item.fixturenames:
            return group
    module = item.nodeid.split("::")[0]
    info = getattr(item, "_fixtureinfo", None)
    for definitions in info.name2fixturedefs.values() if info else ():
        if any(d.scope != "function" and d.baseid == module for d in definitions):
            return module
    return None


def mark_group(item: pytest.Item) -> None:
    """Mark `item` with its group as it is collected (before any plugin's
    `pytest_collection_modifyitems`, where xdist reads the marks)."""
    group = group_of(item)
    if group is not None:
        item.add_marker(pytest.mark.xdist_group(group))


def suffix_groups(items: list[pytest.Item]) -> None:
    """Give each grouped item xdist's `@group` suffix, which `--dist loadgroup` schedules
    by. xdist 3.8 writes it to `item._nodeid`, which pytest 9 no longer reads (a node's id
    is `item._id`): without this every test would be scheduled alone and each worker would
    run the shared pipelines again. Left alone when the suffix is already there."""
    for item in items:
        marker = item.get_closest_marker("xdist_group")
        if marker is None or "@" in item.nodeid.rsplit("::", 1)[-1]:
            continue
        grouped = f"{item.nodeid}@{marker.args[0]}"
        if hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(grouped)
        else:
            item._nodeid = grouped


def order_items(items: list[pytest.Item], long: frozenset[str]) -> None:
    """Order the run as the workers should take it: the groups and the `long` tests (node
    ids without parameters) first, then the rest of the slow tier, the quick tier last to
    fill the gaps (a stable sort: a module keeps its order). `make test` passes
    `--no-loadscope-reorder`, so xdist hands work out in this order, not by group size."""

    def rank(item: pytest.Item) -> int:
        grouped = item.get_closest_marker("xdist_group") is not None
        if grouped or plain_nodeid(item.nodeid).split("[")[0] in long:
            return 0
        return 1 if item.get_closest_marker("slow") else 2

    items.sort(key=rank)


def plain_nodeid(nodeid: str) -> str:
    """A node id without the `@group` suffix xdist adds under `--dist loadgroup`."""
    head, at, group = nodeid.rpartition("@")
    # An "@" inside parameters ("test[ada@corp]") is no suffix: a group name has no "]".
    return head if at and "::" in head and "]" not in group else nodeid
