"""Fixtures shared by the simulator's tests."""

from simulator.paper_run import paper_run  # noqa: F401 (a pytest fixture, used by name)
