"""`SlurmLauncher` (`kind: slurm`): an sbatch script in which srun starts one torchrun
per node, meeting at the first node of the allocation.

The script is one attempt (no retry loop inside: training/launch/job.py retries,
resuming). `sbatch --wait` passes this environment to the job (its default
`--export=ALL`), which is how the tracking credentials reach the ranks without
being written into the script. The job's `output_dir` must be on storage every
node and the submitting host reach (a shared file system or s3://).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from typing import IO

from training.launch.command import torchrun_command
from training.launch.config import SlurmJob
from training.launch.launchers import Launcher, require_tool
from training.launch.processes import child_env, run_process_group

ENDPOINT = "$ENDPOINT"


class SlurmLauncher(Launcher[SlurmJob]):
    """An sbatch script: srun starts one torchrun per node."""

    def render(self, config_uri: str, resume: bool = False) -> str:
        spec = self.spec
        srun = ["srun", "--ntasks-per-node=1", "--kill-on-bad-exit=1"]
        srun += [f"--container-image={spec.image}"] if spec.image else []
        torchrun = torchrun_command(spec, config_uri, resume, spec.python, ENDPOINT)
        # The endpoint is known inside the allocation only: a shell variable, double-quoted.
        run = shlex.join([*srun, *torchrun]).replace(shlex.quote(ENDPOINT), f'"{ENDPOINT}"')
        lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}",
                 f"#SBATCH --nodes={spec.num_nodes}", "#SBATCH --ntasks-per-node=1",
                 f"#SBATCH --cpus-per-task={spec.num_cpus_per_node}",
                 f"#SBATCH --time={spec.time_limit}", "#SBATCH --output=%x-%j.out"]
        lines += [f"#SBATCH --partition={spec.partition}"] if spec.partition else []
        if spec.num_gpus_per_node:
            lines += [f"#SBATCH --gpus-per-node={spec.num_gpus_per_node}"]
        lines += ["set -euo pipefail"]
        lines += [f"export {key}={shlex.quote(value)}" for key, value in spec.env.items()]
        lines += ['HEAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
                  f'ENDPOINT="$HEAD:{spec.rdzv_port}"', run]
        return "\n".join(lines) + "\n"

    def run(self, config_uri: str, resume: bool, env: dict[str, str], log: IO[bytes]) -> int | None:
        sbatch = require_tool("sbatch")
        with tempfile.TemporaryDirectory() as scratch:
            script = os.path.join(scratch, f"{self.spec.job_name}.sbatch")
            with open(script, "w") as handle:
                handle.write(self.render(config_uri, resume))
            return run_process_group([sbatch, "--wait", script], log, self.spec.timeout_s,
                                     child_env(env))
