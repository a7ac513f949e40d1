"""Which of a dataset's split settings may be set together (preprocessing/config.py asks).

A time holdout (`holdout_by: newest`) holds out rows by their time alone; a group's or a
duplicate content's rows may lie on both sides of the cutoff time, so it is refused beside
`group_column` or `duplicates` rather than given a rule that would move rows across the
cutoff (docs/data-path.md, splits). Standard library only: the toolbox imports nothing of
ballast.
"""

from __future__ import annotations

from typing import Any


def time_holdout_problem(spec: Any) -> str | None:
    """What makes `holdout_by`/`holdout_column` inconsistent, in one line; else None."""
    if spec.holdout_by == "random":
        return (
            "dataset.holdout_column is set but dataset.holdout_by is 'random'; set "
            "holdout_by: newest to hold out the newest rows"
            if spec.holdout_column
            else None
        )
    if not spec.holdout_column:
        return "dataset.holdout_by: newest needs dataset.holdout_column (a date column)"
    if spec.holdout_column == spec.label_column:
        return "dataset.holdout_column is the label column; name a date or timestamp column"
    if spec.group_column or spec.duplicates != "keep":
        return (
            "dataset.holdout_by: newest cannot be set with group_column or duplicates: a "
            "group's or a content's rows may span the cutoff time; choose one rule"
        )
    return None
