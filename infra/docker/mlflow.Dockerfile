# syntax=docker/dockerfile:1
# The MLflow tracking server of infra/compose.yaml: MLflow at the constraints' version with
# basic auth, a PostgreSQL backend store and artifacts proxied to S3. Build from the root:
#   docker build -f infra/docker/mlflow.Dockerfile -t ballast-mlflow:0.1.0 .
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH \
    MLFLOW_AUTH_CONFIG_PATH=/etc/mlflow/basic_auth.ini

RUN groupadd --gid 10001 mlflow \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin mlflow \
    && install -d -o 10001 -g 10001 /opt/venv /var/lib/mlflow
COPY infra/docker/mlflow-basic-auth.ini /etc/mlflow/basic_auth.ini
USER 10001:10001
WORKDIR /var/lib/mlflow
RUN python -m venv /opt/venv

COPY constraints.txt /tmp/constraints.txt
# The server's own packages are not ballast dependencies, so they are pinned here:
# the PostgreSQL driver and the auth app's form library (mlflow's `auth` extra).
RUN pip install -c /tmp/constraints.txt 'mlflow[auth]' boto3 \
        'psycopg2-binary==2.9.13' 'Flask-WTF==1.3.0' 'WTForms==3.3.2'

EXPOSE 5000
CMD ["mlflow", "server", "--host", "0.0.0.0", "--port", "5000", "--app-name", "basic-auth"]
