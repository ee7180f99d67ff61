"""LM usage recorded by DSPy's tracker, as the runner's `CallUsage`."""

from __future__ import annotations

from typing import Any

from evolve.simulator.records import CallUsage


def tracked_usage(tracker: Any) -> CallUsage:
    usage = CallUsage()
    for entries in tracker.usage_data.values():
        for entry in entries:
            prompt = entry.get("prompt_tokens", entry.get("input_tokens", 0)) or 0
            completion = entry.get("completion_tokens", entry.get("output_tokens", 0)) or 0
            usage = usage.plus(
                CallUsage(
                    llm_calls=1,
                    prompt_tokens=int(prompt) if isinstance(prompt, int | float) else 0,
                    completion_tokens=int(completion) if isinstance(completion, int | float) else 0,
                )
            )
    return usage
