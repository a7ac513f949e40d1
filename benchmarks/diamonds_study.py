"""The default model's gap to HistGradientBoosting on one table, variant by variant.

`benchmarks/first_hour.py` measures a user's first hour through the command line: every
run pays Prefect's and the job's start-up, and the reshard again. To study why one table
falls short (issue 58: diamonds at 0.906x HGB), this harness reshards the table once per
seed with `ballast init`'s config as proposed (`flows/cli/init_config.describe_inputs`,
the version kept under `--work-dir` and reused), then trains each variant in process with
the pipeline's own job (`training/train.py`'s `build_job` and `fit`: the same streams,
validation split, `select_best` and cosine schedule; one torch thread, seeded), and
scores the network behind the version's codec on the held-out rows, as the pipeline's
evaluation does, beside HGB(class_weight="balanced") fit on every other labelled row.

A variant is init's training settings with some changed, named on the command line:

- `steps=4`: `max_epochs` 4x init's (the size rule's step budget 4x, batch unchanged);
- `scale=0.5`, `freqs=32`, `emb=16`, `members=4`, `dropout=0.05`: `model.tabular`'s
  frequency_scale, frequencies, embedding_size, ensemble_size, dropout;
- `lr=1e-3`, `wd=0.02`, `width=256`, `batch=512`: the learning rate, the weight decay, the
  hidden widths, the batch;
- `epochs=1`: `max_epochs` as given;
- `patience=99`, `monitor=val_macro_f1`: `train.select_best`'s (99: no early stop);
- several joined by `,`: `steps=4,scale=0.5`. `init` alone: init's settings.

Each variant prints one JSON line (the settings, balanced accuracy, HGB's, the ratio,
the train's seconds and the epoch `select_best` chose), e.g.

    PYTHONPATH=$PWD nice -n 19 .venv/bin/python benchmarks/diamonds_study.py \\
        --work-dir /tmp/ds --seeds 0 --variants init steps=2 steps=4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import time
from typing import Any

import lightning
import torch
import yaml

from benchmarks.first_hour import NUM_FILES, holdout_ids, sklearn_scores, write_table
from benchmarks.suite_tables import r_table

# Tables held out from the suite, to check a rule found on it on shapes it was not tuned
# on: ggplot2's movies (58,788 rows: whether a film is a drama from its year, length,
# votes, rating histogram, the other genres; `budget` and `mpaa` mostly null, `title`
# near-unique); for the small-table rules, MASS's Pima.te (332 rows: diabetes from 7
# numbers), Ecdat's Participation (872 rows: labour force participation, numbers and a
# yes/no string) and Ecdat's Wages (4,165 rows: union membership, yes/no strings); for
# the batch's ramp (5,000 to 20,000 training rows), survival's flchain (7,874 rows:
# death from serum free light chains, age, sex, follow-up time; `chapter` mostly null)
# and Ecdat's Computers (6,259 rows: whether a PC has a CD drive from price, speed, ...).
STUDY_TABLES = {
    "movies": lambda: r_table("ggplot2/movies", "Drama"),
    "pima": lambda: r_table("MASS/Pima.te", "type"),
    "participation": lambda: r_table("Ecdat/Participation", "lfp"),
    "wages": lambda: r_table("Ecdat/Wages", "union"),
    "flchain": lambda: r_table("survival/flchain", "death"),
    "computers": lambda: r_table("Ecdat/Computers", "cd"),
}
TABULAR_KEYS = {
    "scale": "frequency_scale",
    "freqs": "frequencies",
    "emb": "embedding_size",
    "members": "ensemble_size",
    "dropout": "dropout",
    "smoothing": "label_smoothing",
}


def write_study_table(table: str, raw: Path) -> Any:
    """The suite's table as first_hour.py writes it, or a study table the same way."""
    if table not in STUDY_TABLES:
        return write_table(table, raw)
    frame = STUDY_TABLES[table]().sample(frac=1.0, random_state=0).reset_index(drop=True)
    frame.insert(0, "id", range(len(frame)))
    raw.mkdir(parents=True, exist_ok=True)
    rows = len(frame) // NUM_FILES + 1
    for index in range(NUM_FILES):
        frame.iloc[index * rows : (index + 1) * rows].to_csv(
            raw / f"{table}-{index}.csv", index=False
        )
    return frame


def reshard_once(table: str, work: Path, seed: int) -> dict[str, Any]:
    """init's config for `table` at `seed`, its version committed under `work` (reused
    when a previous run left it there): the config, the manifest and the raw frame."""
    from distributed import Client, LocalCluster

    from flows.cli.init_config import describe_inputs
    from preprocessing.config import ReshardConfig
    from preprocessing.driver.reshard import run_reshard

    frame = write_study_table(table, work / "raw")
    text = describe_inputs(str(work / "raw"), "target").replace("${WORK_DIR}", str(work))
    config = yaml.safe_load(text)
    config["reshard"]["seed"] = config["train"]["seed"] = seed
    done = work / "version.json"
    if not done.exists():
        with LocalCluster(n_workers=1, threads_per_worker=2) as cluster, Client(cluster) as client:
            version = run_reshard(ReshardConfig.model_validate(config["reshard"]), client)
        done.write_text(json.dumps({"manifest_uri": version.manifest_uri}))
    manifest_uri = json.loads(done.read_text())["manifest_uri"]
    return {"config": config, "manifest_uri": manifest_uri, "frame": frame}


def variant_settings(train: dict[str, Any], variant: str) -> dict[str, Any]:
    """init's `train` section with the variant's changes (see the module's docstring)."""
    train = json.loads(json.dumps(train))
    model = train["model"]
    for change in filter(None, variant.split(",")):
        if change == "init":
            continue
        key, value = change.split("=")
        if key == "steps":
            train["max_epochs"] = round(train["max_epochs"] * float(value))
        elif key == "epochs":
            train["max_epochs"] = int(value)
        elif key == "lr":
            model["learning_rate"] = float(value)
        elif key == "wd":
            model["weight_decay"] = float(value)
        elif key == "width":
            model["hidden_sizes"] = [int(value)] * len(model["hidden_sizes"])
        elif key == "batch":
            train["loader"]["batch_size"] = int(value)
        elif key == "patience":
            train["select_best"]["patience"] = int(value)
        elif key == "monitor":
            train["select_best"]["monitor"] = value
        else:
            field = TABULAR_KEYS[key]
            kind = type(model["tabular"][field])
            model["tabular"][field] = kind(value)
    return train


def train_and_score(version: dict[str, Any], train: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's training job on the version, in process; the network's held-out
    balanced accuracy through the version's codec, the train's seconds, the chosen epoch."""
    from preprocessing.contract.codec import FeatureCodec
    from preprocessing.contract.manifest import read_manifest
    from tracking.lifecycle.scoring import evaluate_classifier
    from tracking.run.pyfunc import CodecClassifier
    from training.config import TrainConfig
    from training.train import build_job, fit

    cfg = TrainConfig.model_validate(
        {**train, "dataset": version["manifest_uri"], "tracking": None}
    )
    torch.set_num_threads(1)  # on the shared 2-core host more threads slow a step
    lightning.seed_everything(cfg.seed, workers=True, verbose=False)
    job = build_job(cfg)
    start = time.perf_counter()
    fit(job, None, None)
    train_s = time.perf_counter() - start
    manifest, _ = read_manifest(version["manifest_uri"])
    classes = list(manifest.classes)
    network = job.model.net
    assert isinstance(network, torch.nn.Module)
    model = CodecClassifier(
        network.eval(),
        FeatureCodec.from_manifest(manifest),
        [str(label) for label in classes],
        classes,
    )
    score = evaluate_classifier(model, version["manifest_uri"])["balanced_accuracy"]
    selection = job.callbacks.selection
    chosen = selection.summary()["epoch"] if selection is not None else None
    return {"balanced_accuracy": score, "train_s": round(train_s, 1), "chosen_epoch": chosen}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--table", default="diamonds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--variants", nargs="+", default=["init"])
    parser.add_argument(
        "--rebalance-above",
        type=float,
        help="init's class-count ratio above which it proposes a uniform class mix (a "
        "variant of the reshard: use its own --work-dir)",
    )
    args = parser.parse_args()
    if args.rebalance_above is not None:
        from flows.cli import init_config

        init_config.IMBALANCE_TO_REBALANCE = args.rebalance_above
    for seed in args.seeds:
        version = reshard_once(args.table, args.work_dir / f"{args.table}-{seed}", seed)
        dataset = version["config"]["reshard"]["dataset"]
        held = holdout_ids(version["manifest_uri"])
        hgb = sklearn_scores(version["frame"], held, dataset, logistic=False)
        for variant in args.variants:
            train = variant_settings(version["config"]["train"], variant)
            ours = train_and_score(version, train)
            record = {
                "table": args.table,
                "seed": seed,
                "variant": variant,
                "max_epochs": train["max_epochs"],
                "batch": train["loader"]["batch_size"],
                "model": train["model"],
                **ours,
                "hgb": round(hgb["hgb"], 4),
                "hgb_fit_s": hgb["hgb_fit_s"],
                "ratio": round(ours["balanced_accuracy"] / hgb["hgb"], 3),
            }
            print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
