"""The registered champion where ballast is not: a virtualenv built only from the model's
own `requirements.txt` (no ballast checkout, no ballast on `sys.path`, the working
directory a temporary one) loads `models:/wine@champion`, predicts raw rows in the label's
own type, passes `mlflow.models.evaluate`, and `mlflow models serve` answers
`/invocations`; a bad row's cause is in the HTTP error body.

The virtualenv is built once per module without a package index: `pip install -r
requirements.txt` took over 10 minutes on this shared 2-core machine, so the packages the
requirements name, and what they require in turn (their installed metadata's
`Requires-Dist`), are linked from this interpreter's site-packages into a fresh
`venv --without-pip` (the exact versions the requirements pin, since the model was logged
from here). Nothing else is linked: no ballast.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement

from tests.services import free_port, stop_server, wait_for_http
from tests.test_real_datasets import wine  # noqa: F401 - the module's dataset fixture

pytestmark = pytest.mark.slow

MODEL = "models:/wine@champion"
FEATURES_OF = "[c for c in frame.columns if c not in ('id', 'target')]"
# Run in the model's virtualenv: load, predict raw rows (one null in an integer column
# without a null policy), evaluate; print what the test checks as JSON.
LOAD_PREDICT_EVALUATE = f"""
import glob, importlib.util, json, sys
import mlflow, pandas as pd
assert importlib.util.find_spec("tracking") is None, sys.path  # no ballast before loading
frame = pd.concat(pd.read_csv(p) for p in sorted(glob.glob(sys.argv[1] + "/*.csv")))
rows = frame[{FEATURES_OF}].copy()
rows.loc[rows.index[0], "proline"] = None
model = mlflow.pyfunc.load_model("{MODEL}")
served = model.predict(rows, params={{"details": True}})
result = mlflow.models.evaluate("{MODEL}", frame.drop(columns=["id"]), targets="target",
                                model_type="classifier")
client = mlflow.MlflowClient()
run = client.get_run(client.get_model_version_by_alias("wine", "champion").run_id)
with open(mlflow.data.get_source(run.inputs.dataset_inputs[0]).load()) as manifest:
    version = json.load(manifest)["version_id"]
print(json.dumps({{"version": version, "dtype": str(served["predicted"].dtype),
                  "right": float((served["predicted"] == frame["target"].to_numpy()).mean()),
                  "filled": served["filled"].tolist()[:2],
                  "metrics": result.metrics,
                  "code": sorted(m.__file__ for m in sys.modules.values()
                                 if getattr(m, "__name__", "").startswith("tracking"))}}))
"""


@pytest.fixture(scope="module")
def champion(wine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:  # noqa: F811
    """The wine MLP logged by `log_model` and registered as `wine@champion` in a sqlite
    store; yields the environment a process of the model's virtualenv runs with."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from tests.feature_data import train_mlp
    from tracking.config import TrackingConfig
    from tracking.run.model import log_model
    from tracking.run.runs import dataset_input

    work, _, result = wine
    home = tmp_path_factory.mktemp("standalone")
    tracking_uri = f"sqlite:///{home}/mlflow.db"
    client = MlflowClient(tracking_uri)
    run = client.create_run(
        client.create_experiment("wine", artifact_location=str(home / "artifacts"))
    )
    client.log_inputs(run.info.run_id, [dataset_input(result.manifest, result.manifest_uri)])
    model_uri = log_model(
        TrackingConfig(tracking_uri=tracking_uri),
        run.info.run_id,
        train_mlp(result.manifest_uri, epochs=30),
        result.manifest_uri,
    )
    client.create_registered_model("wine")
    version = client.create_model_version("wine", model_uri, run_id=run.info.run_id)
    client.set_registered_model_alias("wine", "champion", version.version)
    mlflow.set_tracking_uri(tracking_uri)
    requirements = mlflow.pyfunc.get_model_dependencies(MODEL)
    env = home / "venv"
    link_virtualenv(env, Path(requirements).read_text().split())
    yield {
        "PATH": f"{env / 'bin'}:/usr/bin:/bin",
        "MLFLOW_TRACKING_URI": tracking_uri,
        "HOME": str(home),
        "RAW": str(work / "raw"),
        "CWD": str(home),
        "VERSION": result.manifest.version_id,
    }


def requirement_closure(names: list[str]) -> dict[str, Distribution]:
    """The installed distributions `names` require, with everything they require."""
    found: dict[str, Distribution] = {}
    pending = [Requirement(name) for name in names]
    while pending:
        requirement = pending.pop()
        key = re.sub(r"[-_.]+", "-", requirement.name).lower()
        if key in found or (requirement.marker and not requirement.marker.evaluate()):
            continue
        try:
            found[key] = distribution(requirement.name)
        except PackageNotFoundError:
            continue  # an optional dependency this interpreter does not have
        assert found[key].version in requirement.specifier, (requirement, found[key].version)
        pending += [
            Requirement(text) for text in found[key].requires or [] if "extra ==" not in text
        ]
    return found


def link_virtualenv(env: Path, requirements: list[str]) -> None:
    """A `venv --without-pip` whose site-packages links the requirements' closure, with
    the console scripts MLflow calls (`mlflow`, `uvicorn`) bound to its interpreter."""
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter, not a venv's
    subprocess.run([base, "-m", "venv", "--without-pip", str(env)], check=True)
    site = next((env / "lib").glob("python*/site-packages"))
    for dist in requirement_closure(requirements).values():
        for top in {Path(str(file)).parts[0] for file in dist.files or []} - {"..", "__pycache__"}:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (site / top).exists():
                (site / top).symlink_to(source)
    for name, module in (("mlflow", "mlflow.cli"), ("uvicorn", "uvicorn.main")):
        script = env / "bin" / name
        script.write_text(
            f"#!{env / 'bin' / 'python'}\nimport sys\nfrom {module} import "
            f"{'cli' if name == 'mlflow' else 'main'} as run\nsys.exit(run())\n"
        )
        script.chmod(0o755)


def model_python(champion: dict[str, str], *args: str, **popen: object) -> list[str]:
    return [f"{champion['PATH'].split(':')[0]}/python", *args]


def test_the_champion_loads_predicts_and_evaluates_in_its_own_virtualenv(champion) -> None:
    """Invariants: with no ballast importable, the champion loads from the registry; it
    predicts every raw row, a null in an integer column without a null policy included
    (that row says `proline` was filled); the labels keep the CSV's int64 type and match
    most rows; `mlflow.models.evaluate` gives accuracy, F1 and per-class metrics; the
    ballast code that ran is the model's own copy (its `code/` folder)."""
    env = {key: champion[key] for key in ("PATH", "MLFLOW_TRACKING_URI", "HOME")}
    done = subprocess.run(
        model_python(champion, "-c", LOAD_PREDICT_EVALUATE, champion["RAW"]),
        env=env,
        cwd=champion["CWD"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["version"] == champion["VERSION"]
    assert seen["dtype"] == "int64" and seen["right"] >= 0.8
    assert "proline" in seen["filled"][0]
    assert seen["metrics"]["accuracy_score"] >= 0.8 and "f1_score" in seen["metrics"]
    assert seen["code"] and all("/code/tracking/" in path for path in seen["code"])


@pytest.fixture(scope="module")
def served(champion) -> Iterator[str]:
    """`mlflow models serve` of the champion from the model's virtualenv (its `uvicorn`
    found on PATH, as MLflow execs it by name); yields the server's URL."""
    port = free_port()
    env = {key: champion[key] for key in ("PATH", "MLFLOW_TRACKING_URI", "HOME")}
    log = open(Path(champion["CWD"]) / "serve.log", "ab")  # noqa: SIM115 - child owns it
    process = subprocess.Popen(
        model_python(
            champion,
            "-m",
            "mlflow",
            "models",
            "serve",
            "-m",
            MODEL,
            "--env-manager",
            "local",
            "--host",
            "127.0.0.1",
            "-p",
            str(port),
        ),
        env=env,
        cwd=champion["CWD"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    log.close()
    try:
        wait_for_http(f"http://127.0.0.1:{port}/ping", process, timeout_s=120)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_server(process)


def invoke(url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{url}/invocations",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_mlflow_models_serve_answers_split_and_records_and_names_a_bad_row(
    champion, served
) -> None:
    """Invariants: /invocations answers `dataframe_split` and `dataframe_records` with the
    same int labels, one per row, a null in a column included (with `details`, that row
    names the filled column); a row whose `proline` is text answers 400 with the row, the
    column and the dataset's type in the message."""
    import pandas as pd

    frame = pd.concat(pd.read_csv(path) for path in sorted(Path(champion["RAW"]).glob("*.csv")))
    rows = frame.drop(columns=["id", "target"]).head(20).astype(object)
    rows = rows.where(rows.notna(), None)
    rows.iloc[1, 0] = None
    status, split = invoke(served, {"dataframe_split": rows.to_dict(orient="split")})
    assert status == 200, split
    status, records = invoke(served, {"dataframe_records": rows.to_dict(orient="records")})
    assert status == 200, records
    labels = [row["predicted"] for row in split["predictions"]]
    assert len(labels) == 20 and all(isinstance(label, int) for label in labels), labels
    assert labels == [row["predicted"] for row in records["predictions"]]
    status, detailed = invoke(
        served, {"dataframe_split": rows.to_dict(orient="split"), "params": {"details": True}}
    )
    assert status == 200 and rows.columns[0] in detailed["predictions"][1]["filled"]
    bad = rows.copy()
    bad.loc[bad.index[3], "proline"] = "a lot"
    status, error = invoke(served, {"dataframe_split": bad.to_dict(orient="split")})
    assert status == 400
    assert "row 3" in str(error["message"]) and "'proline'" in str(error["message"])


def test_generate_dockerfile_writes_an_image_that_installs_the_models_requirements(
    champion,
) -> None:
    """Invariants: `mlflow models generate-dockerfile` of the champion, run where ballast is
    not, writes a Dockerfile that installs the model's own requirements and serves it; the
    model directory it copies for the image holds the model's code (`code/`), the codec and
    the weights, and its requirements name no ballast package (nothing the image could not
    install from a package index)."""
    out = Path(champion["CWD"]) / "image"
    env = {key: champion[key] for key in ("PATH", "MLFLOW_TRACKING_URI", "HOME")}
    done = subprocess.run(
        model_python(
            champion, "-m", "mlflow", "models", "generate-dockerfile", "-m", MODEL, "-d", str(out)
        ),
        env=env,
        cwd=champion["CWD"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dockerfile = (out / "Dockerfile").read_text()
    assert "model_dir" in dockerfile and "pip install" in dockerfile, dockerfile
    model = next(path.parent for path in out.rglob("MLmodel"))
    shipped = {path.relative_to(model).as_posix() for path in model.rglob("*") if path.is_file()}
    assert (
        "code/tracking/run/pyfunc.py" in shipped
        and "code/preprocessing/contract/codec.py" in shipped
    )
    assert any(name.endswith("codec.json") for name in shipped), shipped
    assert any(name.endswith("weights.pt") for name in shipped), shipped
    requirements = (model / "requirements.txt").read_text().lower()
    assert "ballast" not in requirements and "mlflow" in requirements, requirements
