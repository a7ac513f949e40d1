"""`ballast demo`: generate a skewed sample, then run the whole pipeline on it locally."""

from __future__ import annotations

import time
from pathlib import Path

from flows.params import PipelineParams, load_preset, parse_params
from flows.pipeline import pipeline
from flows.summary import format_summary
from preprocessing.contract.manifest import read_manifest
from preprocessing.synthetic.tabular import SampleSpec, write_sample


def run_demo(work_dir: str | Path, num_rows: int = 120_000, seed: int = 0) -> str:
    """Write the sample under `work_dir`, run `pipeline`, return the printed summary."""
    work_dir = Path(work_dir).resolve()
    start = time.perf_counter()
    raw = work_dir / "raw"
    if not raw.exists():  # the sample is deterministic: an existing one is the same data
        write_sample(raw, SampleSpec(num_rows=num_rows, seed=seed))
    params = parse_params(PipelineParams, load_preset("demo", work_dir), "demo")
    result = pipeline(params)
    manifest, _ = read_manifest(result["manifest_uri"])
    tracking = params.train.tracking.tracking_uri if params.train.tracking else None
    summary = format_summary(manifest, result, tracking)
    return f"{summary}\ndemo finished in {time.perf_counter() - start:.0f} s"
