"""`ballast inspect`: what a committed dataset version holds (`ballast init`, a starter
config for your own files, is flows/cli/init_config.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from preprocessing.contract.manifest import read_manifest
from preprocessing.contract.names import yaml_text


def describe_version(dataset: str) -> str:
    """`ballast inspect`: a version's classes, sources, shards and null policies (YAML)."""
    manifest, location = read_manifest(dataset)
    splits = {
        name: {
            "num_rows": split.num_rows,
            "num_shards": len(split.shards),
            "num_bytes": sum(entry.num_bytes for entry in split.shards),
            "class_counts": _summed(entry.class_counts for entry in split.shards),
        }
        for name, split in manifest.splits.items()
    }
    columns = manifest.features.get("columns") or []
    report = {
        "version_id": manifest.version_id,
        "manifest": location,
        "created_at": manifest.created_at,
        "columns": {
            "label": manifest.label_column,
            "id": manifest.id_column,
            "source": manifest.source_column,
        },
        "classes": {
            str(value): manifest.input_class_counts.get(str(value), 0) for value in manifest.classes
        },
        "sources": {
            str(value): manifest.input_source_counts.get(str(value), 0)
            for value in manifest.sources
        },
        "splits": splits,
        "features": {
            c["name"]: {
                "kind": c["kind"],
                "type": c["arrow_type"],
                "nulls": c["nulls"],
                "null_count": c["null_count"],
            }
            for c in columns
        }
        or manifest.feature_columns,
        "dropped_rows": manifest.features.get("dropped_rows", {}),
        "unlabelled_rows": manifest.features.get("unlabelled_rows", {}),
    }
    return yaml_text(report)


def _summed(counts: Any) -> dict[str, int]:
    total: Counter[str] = Counter()
    for item in counts:
        total.update(item)
    return {key: int(np.int64(value)) for key, value in sorted(total.items())}
