"""A verdict is read from an interval, never from two point scores."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

CONFIDENCE = 0.95


class Verdict(StrEnum):
    BEATS = "beats"  # the whole interval of the difference is above zero
    WITHIN_NOISE = "within noise"  # the interval includes zero
    WORSE = "worse"  # the whole interval is below zero


class Interval(BaseModel):
    """A two-sided percentile interval."""

    model_config = ConfigDict(frozen=True)

    low: float
    high: float
    level: float = Field(default=CONFIDENCE, description="Coverage the interval aims at.")

    def contains(self, value: float) -> bool:
        return self.low <= value <= self.high

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def format(self, digits: int = 3, signed: bool = False) -> str:
        form = f"{{:+.{digits}f}}" if signed else f"{{:.{digits}f}}"
        return f"[{form.format(self.low)}, {form.format(self.high)}]"


def verdict_of(difference: Interval | None) -> Verdict:
    """beats / within noise / worse, from the interval of a difference (X - Y). No interval
    (nothing to resample) is within noise: a winner needs evidence."""
    if difference is None:
        return Verdict.WITHIN_NOISE
    if difference.low > 0:
        return Verdict.BEATS
    if difference.high < 0:
        return Verdict.WORSE
    return Verdict.WITHIN_NOISE
