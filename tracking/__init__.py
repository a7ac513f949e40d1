"""MLflow adapter: runs, dataset lineage, metrics and artifacts. Imports nothing heavy."""
