"""Paper-readable figures of stored results (tuning studies, evolution runs, evaluations)."""
