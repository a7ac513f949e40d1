"""MLflow, in two rooms: run/ (a training job's MLflow run: lineage, metrics, artifacts, the
model and its pyfunc) and lifecycle/ (the model's life after training: scoring, drift, the
champion, promotion, registration, rollback). Imports nothing heavy."""
