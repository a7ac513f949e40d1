"""The datasets of benchmarks/hetero_bench.py: the demo's tabular sample resharded, and
uneven token sequences. A module of its own, like benchmarks/hetero_models.py, so that
`--baseline` builds an older commit's datasets with that commit's code (a version written
by today's ballast may hold manifest fields an older one refuses):

    python -m benchmarks.hetero_data WORK_DIR ROWS TOKEN_ROWS   # prints their manifest URIs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from preprocessing.config import DatasetSpec, ReshardConfig
from preprocessing.driver.reshard import run_reshard
from preprocessing.synthetic.tabular import SampleSpec, write_sample
from preprocessing.synthetic.tokens import TokenDatasetSpec, write_token_dataset


def tabular_dataset(work: Path, rows: int) -> str:
    """The demo's data: a raw tabular sample resharded into a committed version."""
    raw = work / f"raw-{rows}"
    if not (raw / "_DONE").exists():
        write_sample(raw, SampleSpec(num_rows=rows, num_files=8, seed=0))
        (raw / "_DONE").touch()
    config = ReshardConfig(
        dataset=DatasetSpec(inputs=[str(raw)], id_column="id"),
        output_root=str(work / f"dataset-{rows}"),
        target_shard_rows=8192,
        rows_per_row_group=1024,
        holdout_fraction=0.0,
        num_workers=2,
    )
    return run_reshard(config).manifest_uri


def token_dataset(work: Path, rows: int) -> str:
    """Uneven sequences of 4 to 32 real tokens, padded with id 0."""
    spec = TokenDatasetSpec(
        num_rows=rows,
        holdout_rows=0,
        seq_len=32,
        min_seq_len=4,
        vocab_size=512,
        rows_per_shard=1024,
        rows_per_row_group=128,
    )
    return write_token_dataset(str(work / f"tokens-{rows}"), spec)


def datasets(work: Path, rows: int, token_rows: int) -> dict[str, str]:
    """Both datasets' manifest URIs, by model: `mlp` and `tokens`."""
    return {"mlp": tabular_dataset(work, rows), "tokens": token_dataset(work, token_rows)}


if __name__ == "__main__":
    work, rows, token_rows = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(datasets(work, rows, token_rows)))
