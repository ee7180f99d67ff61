"""What evolution and tuning share, below both: spend and budget limits, the objective and the
frozen records of an evolution."""
