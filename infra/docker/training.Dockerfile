# syntax=docker/dockerfile:1
# The training image: all of ballast (reshard client, torch + Lightning, MLflow, Prefect).
# It runs the flow runs (a Prefect worker and the jobs it starts), the training ranks
# (torchrun, the PyTorchJob, sbatch with a container) and the Prefect server. Two targets:
#   docker build -f infra/docker/training.Dockerfile --target cpu  -t ballast-training:0.1.0-cpu .
#   docker build -f infra/docker/training.Dockerfile --target cuda -t ballast-training:0.1.0-cuda .
# `cpu` takes torch from the CPU wheel index (no CUDA libraries, a far smaller image); `cuda`
# takes PyPI's torch, which brings its CUDA runtime (the host needs only the NVIDIA driver
# and container toolkit). Both pin torch to the version in constraints.txt.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE} AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    PREFECT_SERVER_ANALYTICS_ENABLED=false

RUN groupadd --gid 10001 ballast \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin ballast \
    && install -d -o 10001 -g 10001 /opt/venv /opt/ballast /var/lib/ballast
USER 10001:10001
# infra/prefect.yaml's pull step runs flows from here (entrypoint flows/pipeline.py).
WORKDIR /opt/ballast
RUN python -m venv /opt/venv

COPY --chown=10001:10001 pyproject.toml constraints.txt README.md ./
COPY --chown=10001:10001 preprocessing preprocessing
COPY --chown=10001:10001 training training
COPY --chown=10001:10001 tracking tracking
COPY --chown=10001:10001 flows flows

FROM base AS cuda
RUN pip install -c constraints.txt '.[all]'
CMD ["ballast", "--help"]

# Last, so that a build without --target gives the CPU image.
FROM base AS cpu
# torch alone first, without its dependencies (the CPU index is not a mirror of PyPI), at
# the constraints' version; the second install takes everything else from PyPI, pinned.
RUN TORCH_VERSION="$(sed -n 's/^torch==//p' constraints.txt)" \
    && test -n "$TORCH_VERSION" \
    && pip install --no-deps --index-url https://download.pytorch.org/whl/cpu "torch==${TORCH_VERSION}+cpu" \
    && pip install -c constraints.txt '.[all]'
CMD ["ballast", "--help"]
