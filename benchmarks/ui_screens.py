"""Screenshots of both UIs after a few nights of the pipeline, for a person to look at.

Starts a `prefect server` (with its UI) and an `mlflow server` on loopback, each with its
own database under the work directory, makes the MLflow experiment as an earlier release
did (no kind, one run with only its `git_sha` tag), runs `ballast run pipeline` `--nights`
times on a small generated sample that grows by a file set a night (both arms, a
registered model), registers the deployments as `ballast serve` would (their Parameters
tab), then takes headless Chromium screenshots of: the Prefect flow run (log, artifacts,
the training summary, the link to the night's MLflow run), the nightly deployment's
Parameters tab, the MLflow experiment as it opens (training mode), its runs (a parent run
a night), the last night's run (its summary and child runs), the chart view over the
nights, each arm's run page (params, metrics, dataset), its model metrics and the
registered model version. A work directory holding finished nights is reused (its
servers' databases; `--fresh` runs the nights again). The PNGs and an `index.json` (each
page's URL) are written under `--out`; nothing is installed here: without Chromium the
script says how to get it and stops.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/ui_screens.py --work-dir /tmp/ui --out /tmp/ui/png
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: the clone's packages
    sys.path.insert(0, str(ROOT))

from tests import services  # noqa: E402 - after the clone's root is on sys.path
from tracking.run.origin import TRAINING_VIEW as VIEW  # noqa: E402 - likewise

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
)
MODEL_NAME = "ui-screens-classifier"
EXPERIMENT = "ui-screens"


def browser() -> str:
    """The Chromium on PATH; else exits saying how to install it."""
    for name in BROWSERS:
        if found := shutil.which(name):
            return found
    sys.exit(
        "ui_screens: no Chromium on PATH. Install it, e.g. on Debian/Ubuntu as root: "
        "`apt-get install -y chromium` (or put chromium / google-chrome on PATH)."
    )


def prefect_env(work: Path, port: int) -> dict[str, str]:
    """The test services' Prefect environment with the UI on, the clone's packages and
    ballast's run logs under `work`."""
    return {
        **services.prefect_env(work / "prefect-home", port),
        "PREFECT_UI_ENABLED": "true",
        "PYTHONPATH": str(ROOT),
        "BALLAST_LOG_DIR": str(work / "logs"),
    }


def pipeline_config(work: Path, tracking_uri: str, night: int) -> dict[str, Any]:
    """The demo preset on the first `night` nights' files, tracked on the MLflow server,
    both arms."""
    from flows.params import load_preset

    config = load_preset("demo", work)
    config["reshard"]["dataset"]["inputs"] = [str(raw_dir(work, n)) for n in range(1, night + 1)]
    config["reshard"]["target_shard_rows"] = 2000
    config["train"]["max_epochs"] = 3
    config["train"]["tracking"] = {
        "tracking_uri": tracking_uri,
        "experiment": EXPERIMENT,
        "registered_model_name": MODEL_NAME,
        "system_metrics_interval_s": 1.0,
    }
    config["job"] = {
        "kind": "local",
        "num_processes_per_node": 2,
        "timeout_s": 900,
        "retry": {"attempts": 1},
    }
    return config


def raw_dir(work: Path, night: int) -> Path:
    return work / "raw" / f"night-{night}"


def earlier_release_run(tracking_uri: str) -> None:
    """The experiment as an earlier release left it: no kind, a run tagged `git_sha` only."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri)
    if client.get_experiment_by_name(EXPERIMENT) is None:
        experiment = client.create_experiment(EXPERIMENT)
        run = client.create_run(experiment, run_name="earlier-release", tags={"git_sha": "0" * 40})
        client.log_metric(run.info.run_id, "val_macro_f1", 0.5)
        client.set_terminated(run.info.run_id)


def write_night(work: Path, night: int, rows: int) -> None:
    """The night's generated files, their ids after every earlier night's (ids are unique
    across a version's files)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from preprocessing.synthetic.tabular import SampleSpec, write_sample

    write_sample(raw_dir(work, night), SampleSpec(num_rows=rows, num_files=6, seed=night))
    for path in sorted(raw_dir(work, night).glob("*.parquet")):
        table = pq.read_table(path)
        ids = pc.add(table["id"], (night - 1) * 10**9)
        pq.write_table(table.set_column(table.schema.get_field_index("id"), "id", ids), path)


def run_nights(
    work: Path, env: dict[str, str], tracking_uri: str, rows: int, nights: int, fresh: bool
) -> list:
    """`ballast run pipeline` once a night, each night on one more generated file set of
    `rows` rows (a night whose result is in `work` is kept, unless `fresh`); the results."""
    earlier_release_run(tracking_uri)
    results = []
    for night in range(1, nights + 1):
        done = work / f"result-{night}.json"
        if fresh or not done.exists():
            run_pipeline(work, env, tracking_uri, rows, night)
        results.append(json.loads(done.read_text()))
    return results


def run_pipeline(work: Path, env: dict[str, str], tracking_uri: str, rows: int, night: int) -> dict:
    """`ballast run pipeline` on the files of nights 1 to `night`; its full result."""
    if not raw_dir(work, night).exists():
        write_night(work, night, rows)
    config_file, result_file = work / f"pipeline-{night}.yaml", work / f"result-{night}.json"
    config_file.write_text(yaml.safe_dump(pipeline_config(work, tracking_uri, night)))
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows",
            "run",
            "pipeline",
            "--config",
            str(config_file),
            "--result-file",
            str(result_file),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    print(done.stdout, file=sys.stderr)
    if done.returncode:
        raise RuntimeError(f"ballast run pipeline failed:\n{done.stderr[-4000:]}")
    return dict(json.loads(result_file.read_text()))


def prefect_ids(work: Path, api_url: str) -> dict[str, str]:
    """The pipeline's last completed flow run, its training-summary artifact and the
    nightly deployment (registered here from the deployments table, as `ballast serve`
    registers them)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.deployments import build_deployments

    with temporary_settings({PREFECT_API_URL: api_url}):
        for deployment in build_deployments(work):
            deployment.apply()
        return asyncio.run(_read_ids())


async def _read_ids() -> dict[str, str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        runs = [
            run
            for run in await client.read_flow_runs()
            if run.state is not None and run.state.is_completed() and run.deployment_id is None
        ]
        run = max(runs, key=lambda found: found.created or 0)
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run.id]))
        )
        summary = next(a for a in artifacts if a.key == "training-summary")
        link = next(a for a in artifacts if a.key == "mlflow-night-run")
        nightly = await client.read_deployment_by_name("pipeline/nightly")
    return {
        "flow_run": str(run.id),
        "summary": str(summary.id),
        "night_link": str(link.id),
        "nightly": str(nightly.id),
    }


def pages(prefect: str, mlflow: str, ids: dict[str, str], result: dict) -> dict[str, str]:
    """Screenshot name -> URL."""
    from mlflow.tracking import MlflowClient

    experiment = MlflowClient(mlflow).get_experiment_by_name(EXPERIMENT)
    assert experiment is not None, f"no MLflow experiment {EXPERIMENT}"
    exp, run = experiment.experiment_id, f"{prefect}/runs/flow-run/{ids['flow_run']}"
    registration = result["registration"]
    # The flow run's tabs are not addressed by URL in headless Chromium (`?tab=` stays on
    # Logs): its artifacts are shown by the training summary's own page.
    found = {
        "prefect-flow-run-log": run,
        "prefect-training-summary": f"{prefect}/artifacts/artifact/{ids['summary']}",
        "prefect-night-link": f"{prefect}/artifacts/artifact/{ids['night_link']}",
        "prefect-deployment-parameters": (
            f"{prefect}/deployments/deployment/{ids['nightly']}?tab=Parameters"
        ),
        # MLflow 3.17.2's UI takes its mode from the address (`workflowType`), else the
        # browser's last choice (GenAI at first), not from the experiment's kind: the
        # plain address shows which; ballast's links carry the training view.
        "mlflow-experiment-plain-address": f"{mlflow}/#/experiments/{exp}",
        "mlflow-experiment-training-mode": f"{mlflow}/#/experiments/{exp}?{VIEW}",
        "mlflow-night-run": f"{mlflow}/#/experiments/{exp}/runs/{result['night_run_id']}?{VIEW}",
        "mlflow-nights-chart": (
            f"{mlflow}/#/experiments/{exp}/runs?{VIEW}&compareRunsMode=CHART&searchFilter="
            + quote("tags.`ballast.night` = 'true'")
        ),
        "mlflow-model-version": (
            f"{mlflow}/#/models/{registration['name']}/versions/{registration['version']}"
        ),
    }
    for arm, run_id in result["runs"].items():
        found[f"mlflow-run-{arm}"] = f"{mlflow}/#/experiments/{exp}/runs/{run_id}?{VIEW}"
        found[f"mlflow-run-{arm}-metrics"] = (
            f"{mlflow}/#/experiments/{exp}/runs/{run_id}/model-metrics?{VIEW}"
        )
    return found


def screenshot(chromium: str, url: str, out: Path, size: str, wait_ms: int) -> None:
    """One page as a PNG: a fresh profile, no network but loopback, `wait_ms` of page time
    for the single-page apps to fetch and draw."""
    with tempfile.TemporaryDirectory(prefix="ui-screens-profile-") as profile:
        subprocess.run(
            [
                chromium,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={size}",
                f"--virtual-time-budget={wait_ms}",
                f"--screenshot={out}",
                url,
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default="ui-screens", help="servers' data, the sample")
    parser.add_argument("--out", default=None, help="PNGs here (default: WORK_DIR/png)")
    parser.add_argument("--rows", type=int, default=6000, help="rows a night adds")
    parser.add_argument("--nights", type=int, default=3, help="pipeline runs, a night each")
    parser.add_argument("--size", default="1400,1000", help="browser window WIDTH,HEIGHT")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="run the nights again even when WORK_DIR holds them (results.json), else reused",
    )
    parser.add_argument("--wait-ms", type=int, default=25000, help="page time per shot")
    args = parser.parse_args()
    chromium = browser()
    work = Path(args.work_dir).resolve()
    out = Path(args.out).resolve() if args.out else work / "png"
    for folder in (work / "prefect-home", work / "mlflow", work / "logs", out):
        folder.mkdir(parents=True, exist_ok=True)
    prefect_port, mlflow_port = services.free_port(), services.free_port()
    env = prefect_env(work, prefect_port)
    prefect, mlflow = f"http://127.0.0.1:{prefect_port}", f"http://127.0.0.1:{mlflow_port}"
    with ExitStack() as stack:
        # The tests' own servers (tests/services.py): MLflow without its job runner.
        stack.callback(services.stop_server, services.start_prefect_server(env, prefect_port))
        stack.callback(
            services.stop_server, services.start_mlflow_server(work / "mlflow", mlflow_port)
        )
        done = work / "results.json"
        if not done.exists() or args.fresh:
            nights = run_nights(work, env, mlflow, args.rows, args.nights, args.fresh)
            done.write_text(json.dumps(nights))
        result = json.loads(done.read_text())[-1]  # the last night's
        found = pages(prefect, mlflow, prefect_ids(work, env["PREFECT_API_URL"]), result)
        for name, url in found.items():
            screenshot(chromium, url, out / f"{name}.png", args.size, args.wait_ms)
            print(f"{name}: {url}", flush=True)
        (out / "index.json").write_text(json.dumps(found, indent=2))
    print(f"screenshots in {out}")


if __name__ == "__main__":
    main()
