-- Runs once, on an empty data volume: PostgreSQL holds two stores, MLflow's (POSTGRES_DB,
-- "mlflow") and the Prefect server's.
CREATE DATABASE prefect;
