"""A training job's MLflow run: opened, logged to (params, metrics, plots, the model), kept
in its spool while the server is away, delivered and closed."""
