"""Exporting the best policy as a bundle and registering it in the MLflow model registry."""
