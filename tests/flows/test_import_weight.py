"""A flow process does not pay for torch: the suite starts about thirty of them, and a
`ballast` command or a Prefect worker's flow run imports the same modules."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_the_pipeline_flow_and_the_cli_import_without_torch_or_lightning() -> None:
    """torch is imported only where a network is saved or a model is scored, in the
    processes that do so; importing the flow and the command line loads neither."""
    code = (
        "import sys, flows.pipeline, flows.cli.main, tracking.lifecycle.scoring; "
        "print([m for m in ('torch', 'lightning') if m in sys.modules])"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"
