"""What a committed version's manifest asks a person to check, as lines of text: the rows
left out for want of a label (per file) and the feature columns that identify rows.

One source for the run log (flows/runlog.py) and the run's summary (flows/cli/summary.py),
so both say the same. The counts are the scan's, kept in the manifest's `features`:
`unlabelled_rows` ({file: rows}) and `identifying_columns` ({column: {distinct, rows}}).
"""

from __future__ import annotations

from preprocessing.contract.manifest import Manifest

MAX_FILE_LINES = 10  # a run over thousands of files names the first ones, counts the rest


def unlabelled_lines(manifest: Manifest) -> list[str]:
    """`N unlabelled rows left out (dataset.unlabelled: drop)` and one line per file."""
    per_file = manifest.features.get("unlabelled_rows") or {}
    if not per_file:
        return []
    total = sum(int(count) for count in per_file.values())
    lines = [
        f"{total} rows without a label ('{manifest.label_column}') left out "
        f"(dataset.unlabelled: drop), in {len(per_file)} files:"
    ]
    ordered = sorted(per_file.items())
    lines += [f"  {uri}: {count}" for uri, count in ordered[:MAX_FILE_LINES]]
    if len(ordered) > MAX_FILE_LINES:
        lines.append(
            f"  and {len(ordered) - MAX_FILE_LINES} more files (the manifest's "
            "features.unlabelled_rows lists them)"
        )
    return lines


def identifying_lines(manifest: Manifest) -> list[str]:
    """One warning per feature column whose distinct values approach its row count."""
    found = manifest.features.get("identifying_columns") or {}
    return [
        identifying_message(name, **counts) + " (dataset.on_identifying_feature: "
        "refuse makes this an error)"
        for name, counts in found.items()
    ]


def identifying_message(name: str, distinct: int, rows: int) -> str:
    """What the run log, the summary and the scan's refusal say of an identifying feature."""
    return (
        f"feature column '{name}' holds about {distinct} distinct values in {rows} "
        "rows: it identifies rows (a key), which a model memorises instead of learning; "
        "leave it out of dataset.feature_columns, or name it as dataset.id_column"
    )
