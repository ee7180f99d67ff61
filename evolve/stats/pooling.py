"""Pooling units (environment seeds, replicates) with a random-effects model.

Each unit gives an estimate and its variance (the square of its bootstrap standard error).
The between-unit variance tau^2 is DerSimonian-Laird's; the pooled interval is
Hartung-Knapp-Sidik-Jonkman's (a t interval on k - 1 degrees of freedom with a weighted
residual variance), which keeps its coverage with few units where the plain normal interval
is too narrow. Heterogeneity: Cochran's Q against chi^2 on k - 1 degrees of freedom, and I^2.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from scipy import stats as scipy_stats

from evolve.stats.verdict import CONFIDENCE, Interval, Verdict, verdict_of

POOLING_METHOD = "random effects: DerSimonian-Laird tau^2, Hartung-Knapp-Sidik-Jonkman interval"


class PooledEstimate(BaseModel):
    model_config = ConfigDict(frozen=True)

    units: int
    estimates: list[float] = Field(description="Each unit's estimate, in the order given.")
    value: float
    interval: Interval | None = Field(default=None, description="None with one unit.")
    tau_squared: float = Field(description="Between-unit variance.")
    q_statistic: float
    heterogeneity_p: float | None = Field(description="Cochran's Q test (None: one unit).")
    i_squared: float | None = None
    method: str = POOLING_METHOD

    @property
    def verdict(self) -> Verdict:
        return verdict_of(self.interval)


# Variances below this are floored: a unit whose every resample agrees (all right, say) would
# otherwise get infinite weight.
_VARIANCE_FLOOR = 1e-6


def random_effects(estimates: Sequence[float], standard_errors: Sequence[float]) -> PooledEstimate:
    values = np.asarray(estimates, dtype=float)
    variances = np.maximum(np.asarray(standard_errors, dtype=float) ** 2, _VARIANCE_FLOOR)
    units = len(values)
    if units == 0 or len(variances) != units:
        raise ValueError("need one standard error per estimate, and at least one estimate")
    weights = 1.0 / variances
    fixed = float((weights * values).sum() / weights.sum())
    q = float((weights * (values - fixed) ** 2).sum())
    if units == 1:
        return PooledEstimate(
            units=1,
            estimates=values.tolist(),
            value=float(values[0]),
            tau_squared=0.0,
            q_statistic=0.0,
            heterogeneity_p=None,
        )
    degrees = units - 1
    scale = weights.sum() - (weights**2).sum() / weights.sum()
    tau_squared = max(0.0, (q - degrees) / scale)
    random_weights = 1.0 / (variances + tau_squared)
    pooled = float((random_weights * values).sum() / random_weights.sum())
    spread = (random_weights * (values - pooled) ** 2).sum() / (degrees * random_weights.sum())
    half = float(scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, degrees) * np.sqrt(spread))
    return PooledEstimate(
        units=units,
        estimates=values.tolist(),
        value=pooled,
        interval=Interval(low=pooled - half, high=pooled + half),
        tau_squared=tau_squared,
        q_statistic=q,
        heterogeneity_p=float(scipy_stats.chi2.sf(q, degrees)),
        i_squared=max(0.0, (q - degrees) / q) if q > 0 else 0.0,
    )
