"""The Prefect run log's straggler line (flows/runlog.py): which rank is slowest, by how
much, and what it costs the job, from the figures a training summary carries."""

from __future__ import annotations

from flows.runlog import MAX_BALANCE_LINES, balance_lines, straggler_line


def test_the_straggler_line_names_the_slowest_rank_and_what_it_costs() -> None:
    """Rank 1 of 2, 1.5x the median's busy time, 25 % of the step lost: all three are in
    the line, with each rank's step and blocked all-reduce time in milliseconds."""
    summary = {
        "straggler": {"rank": 1, "slowdown_vs_median": 1.5, "lost_share": 0.25},
        "step_s_per_rank": [0.12, 0.121],
        "allreduce_blocked_s_per_rank": [0.06, 0.001],
    }
    line = straggler_line(summary)
    assert line is not None
    assert line.startswith("slowest rank 1, 1.50x the median rank's busy time")
    assert "loses 25.0% of each step" in line
    assert "rank 0 120.0 ms (60.0 ms blocked in all-reduce)" in line


def test_no_straggler_line_without_measured_all_reduce() -> None:
    """A summary without the figures (one process, FSDP, or an older summary) gives none."""
    assert straggler_line({"straggler": None}) is None
    assert straggler_line({}) is None


def test_the_balance_lines_name_the_slower_rank_and_its_rows() -> None:
    """Under `loader.balance: speed` the run log repeats rank 0's lines of the split's
    moves, the last MAX_BALANCE_LINES of them; a summary without moves gives none."""
    moves = [f"step {step}: rank 1 slower: 382/130 rows a step" for step in range(30)]
    lines = balance_lines({"balance_moves": moves})
    assert len(lines) == MAX_BALANCE_LINES
    assert lines[-1] == "balance: step 29: rank 1 slower: 382/130 rows a step"
    assert balance_lines({}) == [] and balance_lines({"balance_moves": None}) == []
