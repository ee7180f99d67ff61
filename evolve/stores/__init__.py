"""Which stores a command uses and what they accept: the MLflow tracking URI, database URLs
(MLflow and Optuna), MLflow's limits on names and texts, and registered-model names."""
