# syntax=docker/dockerfile:1
# The preprocessing image: ballast's reshard on pyarrow + Dask + s3fs, no torch. It runs the
# Dask scheduler and workers (compose, the DaskCluster in infra/k8s, any `kind: address`
# cluster). Build from the repository root:
#   docker build -f infra/docker/preprocessing.Dockerfile -t ballast-preprocessing:0.1.0 .
# Clients (the flow runs, in the training image) must run the same ballast, dask and
# Python versions: both images install from the same constraints.txt on the same base.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# Workers keep freed memory in glibc's heap: Dask's nanny default (a 64 KiB trim threshold)
# page-faults on every numpy temporary (docs/architecture.md M21). The nanny takes these from
# its environment over its own default and passes them to the worker processes it spawns.
# The values of preprocessing.executor.WORKER_MALLOC_ENV.
ENV MALLOC_MMAP_THRESHOLD_=67108864 \
    MALLOC_TRIM_THRESHOLD_=268435456

RUN groupadd --gid 10001 ballast \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin ballast \
    && install -d -o 10001 -g 10001 /opt/venv /opt/ballast /var/lib/ballast
USER 10001:10001
WORKDIR /opt/ballast
RUN python -m venv /opt/venv

COPY --chown=10001:10001 pyproject.toml constraints.txt README.md ./
COPY --chown=10001:10001 preprocessing preprocessing
# setuptools lists all four packages; only the preprocessing extras are installed.
COPY --chown=10001:10001 flows flows
COPY --chown=10001:10001 training training
COPY --chown=10001:10001 tracking tracking
RUN pip install -c constraints.txt '.[s3]'

CMD ["dask", "scheduler"]
