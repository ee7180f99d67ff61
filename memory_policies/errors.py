"""Errors raised by memory policies (kept free of `evolve` imports)."""

from __future__ import annotations


class PolicyError(Exception):
    """A policy spec, bundle or parameter is invalid; the message says how to fix it."""

    exit_code: int = 2
