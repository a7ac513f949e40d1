"""A generated sample of skewed raw data, deterministic from a seed (for the demo and tests).

Files of very uneven size (zipf), classes with a long-tailed frequency (the
largest `class_ratio` times the smallest), several sources with their own
offsets, a fixed-size-list feature vector whose class means overlap under the
noise (learnable, not trivial), and a unique int64 id per row.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


@dataclass(frozen=True)
class SampleSpec:
    """Shape of the generated raw data."""

    num_rows: int = 120_000
    num_files: int = 24
    num_classes: int = 10
    num_sources: int = 3
    num_features: int = 16
    class_ratio: float = 50.0
    class_separation: float = 1.1
    seed: int = 0


def class_probabilities(num_classes: int, ratio: float) -> np.ndarray:
    """Geometric long tail: p[0] / p[-1] == ratio."""
    weights = ratio ** (-np.arange(num_classes) / max(num_classes - 1, 1))
    return weights / weights.sum()


def file_sizes(num_rows: int, num_files: int) -> np.ndarray:
    """Zipf-like rows per file summing to `num_rows`, each file at least 20 rows."""
    weights = 1.0 / np.arange(1, num_files + 1) ** 1.3
    sizes = np.maximum(20, np.floor(weights / weights.sum() * num_rows)).astype(np.int64)
    sizes[0] += num_rows - sizes.sum()
    return sizes


def _features(
    rng: np.random.Generator, labels: np.ndarray, source: int, spec: SampleSpec
) -> np.ndarray:
    means = np.random.default_rng(spec.seed + 1).normal(
        0, spec.class_separation, (spec.num_classes, spec.num_features)
    )
    offsets = np.random.default_rng(spec.seed + 2).normal(
        0, 0.3, (spec.num_sources, spec.num_features)
    )
    noise = rng.normal(0, 1, (len(labels), spec.num_features))
    return (means[labels] + offsets[source] + noise).astype(np.float32)


def sample_table(
    rng: np.random.Generator, first_id: int, num_rows: int, source: int, spec: SampleSpec
) -> pa.Table:
    """One raw file's rows: id, label, source, features."""
    probabilities = class_probabilities(spec.num_classes, spec.class_ratio)
    labels = rng.choice(spec.num_classes, size=num_rows, p=probabilities)
    features = _features(rng, labels, source, spec)
    flat = pa.array(features.reshape(-1), type=pa.float32())
    return pa.table(
        {
            "id": pa.array(np.arange(first_id, first_id + num_rows), pa.int64()),
            "label": pa.array(labels, pa.int64()),
            "source": pa.array([f"source-{source}"] * num_rows, pa.string()),
            "features": pa.FixedSizeListArray.from_arrays(flat, spec.num_features),
        }
    )


def write_sample(directory: str | Path, spec: SampleSpec = SampleSpec()) -> list[Path]:
    """Write `spec.num_files` Parquet files under `directory`; returns their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(spec.seed)
    paths, first_id = [], 0
    for index, num_rows in enumerate(file_sizes(spec.num_rows, spec.num_files)):
        table = sample_table(rng, first_id, int(num_rows), index % spec.num_sources, spec)
        path = directory / f"raw-{index:03d}.parquet"
        pq.write_table(table, path, row_group_size=int(rng.integers(2_000, 9_000)))
        paths.append(path)
        first_id += int(num_rows)
    return paths
