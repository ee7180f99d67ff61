"""A two-stage cluster bootstrap: users, then questions within users, per stratum.

Hand-written because SciPy's `scipy.stats.bootstrap` resamples one level of independent
observations, and a user's questions are not independent of each other (the same memory
answers them all). Drawing users with replacement and then each drawn user's questions with
replacement counts the within-user spread twice (once in the user means, once again in the
second stage), which makes intervals too wide when users differ little. So the stages are
matched to the two variance components (Davison & Hinkley 1997, section 3.8): the first
stage draws *shrunken* user means, the spread between users minus what their question counts
explain, and the second stage draws each user's residuals scaled by sqrt(m / (m - 1)). The
bootstrap variance of a stratum's mean is then the unbiased between-user variance of a
two-level design, and with one user in a stratum, the within-user variance alone (inference
conditional on that user).

Everything is vectorized over resamples (`numpy.random.Generator`, seeded by the caller), and
what comes back is each resample's column sums and question count: statistics (accuracy, a
memory-score ratio, a paired difference) are computed from those by the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Resamples:
    """Per resample: the sum of every column over the drawn questions, and their count."""

    sums: np.ndarray  # (resamples, columns)
    counts: np.ndarray  # (resamples,)

    def means(self, column: int) -> np.ndarray:
        return self.sums[:, column] / self.counts


def two_stage_resamples(
    columns: np.ndarray,
    cluster: np.ndarray,
    cluster_stratum: np.ndarray,
    *,
    primary: int,
    resamples: int,
    rng: np.random.Generator,
) -> Resamples:
    """`columns` (questions x k), each question's cluster (user) index, each cluster's stratum
    index; `primary` is the column whose variance components set the first stage's shrinkage
    (the paired difference, or a policy's correctness)."""
    columns = np.asarray(columns, dtype=float)
    if columns.ndim != 2 or len(columns) != len(cluster):
        raise ValueError("columns must be (questions, k) with one cluster index per question")
    clusters = int(cluster.max()) + 1 if len(cluster) else 0
    sizes = np.bincount(cluster, minlength=clusters).astype(float)
    means = np.zeros((clusters, columns.shape[1]))
    np.add.at(means, cluster, columns)
    means /= np.maximum(sizes, 1.0)[:, None]
    residuals = columns - means[cluster]
    order = np.argsort(cluster, kind="stable")
    sorted_residuals = residuals[order]
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    within_scale = np.where(sizes > 1, np.sqrt(sizes / np.maximum(sizes - 1, 1)), 0.0)

    # Strata padded to the largest one, so that every stratum is drawn in one array op.
    stratum_ids = np.unique(cluster_stratum)
    member_lists = [np.flatnonzero(cluster_stratum == s) for s in stratum_ids]
    widest = max(len(m) for m in member_lists)
    padded = np.array([np.pad(m, (0, widest - len(m)), mode="edge") for m in member_lists])
    stratum_users = np.array([len(m) for m in member_lists])
    shrunken = np.zeros_like(means)
    for members in member_lists:
        shrunken[members] = _shrunken_means(
            means[members], sizes[members], residuals, cluster, members, primary
        )
    strata = len(member_lists)
    slot = np.floor(rng.random((resamples, strata, widest)) * stratum_users[None, :, None])
    drawn = padded[np.arange(strata)[None, :, None], slot.astype(np.int64)]  # (B, S, U)
    in_stratum = np.arange(widest)[None, None, :] < stratum_users[None, :, None]
    drawn_sizes = np.where(in_stratum, sizes[drawn], 0.0)
    longest = int(sizes.max())
    # Each drawn user's questions: uniform positions within its own block of residuals,
    # tallied per resample (one bincount), so the residual sums are one matrix product.
    positions = np.floor(rng.random(drawn.shape + (longest,)) * drawn_sizes[..., None])
    valid = np.arange(longest) < drawn_sizes[..., None]
    questions = len(columns)
    flat = np.where(valid, offsets[drawn][..., None] + positions.astype(np.int64), questions)
    flat += (np.arange(resamples) * (questions + 1))[:, None, None, None]
    tallies = np.bincount(flat.ravel(), minlength=resamples * (questions + 1))
    tallies = tallies.reshape(resamples, questions + 1)[:, :questions].astype(float)
    scaled = sorted_residuals * within_scale[cluster[order]][:, None]
    residual_sums = tallies @ scaled
    slot_sums = (shrunken[drawn] * drawn_sizes[..., None]).sum(axis=(1, 2))
    total_sums = slot_sums + residual_sums
    total_counts = drawn_sizes.sum(axis=(1, 2))
    return Resamples(sums=total_sums, counts=total_counts)


def _shrunken_means(
    member_means: np.ndarray,
    member_sizes: np.ndarray,
    residuals: np.ndarray,
    cluster: np.ndarray,
    members: np.ndarray,
    primary: int,
) -> np.ndarray:
    """The stratum's user means pulled toward its grand mean so that drawing them with
    replacement reproduces the between-user variance net of the within-user noise."""
    grand = (member_means * member_sizes[:, None]).sum(axis=0) / member_sizes.sum()
    users = len(members)
    if users < 2:
        return np.broadcast_to(grand, member_means.shape).copy()
    between = np.var(member_means[:, primary], ddof=1)
    within_of_mean = np.mean(
        [
            np.var(residuals[cluster == member, primary], ddof=1) / size if size > 1 else 0.0
            for member, size in zip(members, member_sizes, strict=True)
        ]
    )
    excess = max(0.0, between - within_of_mean)
    factor = np.sqrt(excess * users / ((users - 1) * between)) if between > 0 else 0.0
    return grand + factor * (member_means - grand)
