"""Foundations every layer uses: errors, atomic files, cache paths, seeds, run locks, the
process-wide stop, the protocol rules (`paper`, `evolve`) and the base of every spec model."""
