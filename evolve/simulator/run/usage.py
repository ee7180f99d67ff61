"""LM usage recorded by DSPy's tracker, as a `Usage`: DSPy's tracker sees only the calls the
server answered, so `calls` counts those and `cache_hits` stays 0."""

from __future__ import annotations

from typing import Any

from evolve.llm.usage import Usage


def tracked_usage(tracker: Any) -> Usage:
    usage = Usage()
    for entries in tracker.usage_data.values():
        for entry in entries:
            prompt = entry.get("prompt_tokens", entry.get("input_tokens", 0)) or 0
            completion = entry.get("completion_tokens", entry.get("output_tokens", 0)) or 0
            usage = usage + (
                Usage(
                    calls=1,
                    prompt_tokens=int(prompt) if isinstance(prompt, int | float) else 0,
                    completion_tokens=int(completion) if isinstance(completion, int | float) else 0,
                )
            )
    return usage
