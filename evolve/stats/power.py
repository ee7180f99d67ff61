"""Power and sample size for a paired difference, from a standard error.

A study is sized from a pilot: the bootstrap standard error of a difference on n users
shrinks as sqrt(n), so the error on N users is SE * sqrt(n / N). "Beats" is printed when the
95% interval's lower end is above zero, so the power to print it for a true gain d is
Phi(d / SE - z), z = 1.96 (the chance of "worse" on a true gain is negligible and not counted).
"""

from __future__ import annotations

import math

from scipy import stats as scipy_stats

from evolve.stats.verdict import CONFIDENCE

_Z = float(scipy_stats.norm.ppf(0.5 + CONFIDENCE / 2))


def power_to_beat(effect: float, standard_error: float) -> float:
    """The chance that the interval of a difference lies above zero when its truth is
    `effect`."""
    if standard_error <= 0:
        return 1.0 if effect > 0 else 0.0
    return float(scipy_stats.norm.cdf(effect / standard_error - _Z))


def minimum_detectable(standard_error: float, power: float = 0.8) -> float:
    """The smallest true gain that is called "beats" with probability `power`."""
    return (_Z + float(scipy_stats.norm.ppf(power))) * standard_error


def scaled_standard_error(standard_error: float, users_now: int, users_then: int) -> float:
    """The error of the same design with `users_then` users instead of `users_now`."""
    return standard_error * math.sqrt(users_now / users_then)


def users_needed(standard_error: float, users_now: int, half_width: float) -> int:
    """Users for a 95% interval at most +-`half_width` wide, from a pilot's error."""
    if half_width <= 0:
        raise ValueError(f"half_width must be positive, got {half_width}")
    return max(1, math.ceil(users_now * (_Z * standard_error / half_width) ** 2))


def users_to_detect(
    standard_error: float, users_now: int, effect: float, power: float = 0.8
) -> int:
    """Users for a true gain `effect` to be called "beats" with probability `power`."""
    if effect <= 0:
        raise ValueError(f"effect must be positive, got {effect}")
    needed = (minimum_detectable(standard_error, power) / effect) ** 2 * users_now
    return max(1, math.ceil(needed))
