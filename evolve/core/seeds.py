"""The one seed derivation in evolve: a stable integer from any parts.

Python's `hash()` is salted per process, so seeds are taken from SHA-256 of the parts joined
with "/". A `bits`-wide seed is the digest's first `ceil(bits / 8)` bytes (big-endian) masked
to `bits`: 31 bits fit every LLM endpoint's `seed` and numpy; 64 bits seed `random.Random`.
Both widths reproduce the values evolve has always derived, so environments and episodes made
before this module existed keep their content.
"""

from __future__ import annotations

import hashlib
import random

LLM_SEED_BITS = 31
RNG_SEED_BITS = 64


def derive_seed(*parts: object, bits: int = LLM_SEED_BITS) -> int:
    """A stable `bits`-wide seed from `parts` (their `str()`, joined with "/")."""
    if not 1 <= bits <= 256:
        raise ValueError(f"seed width must be 1..256 bits, got {bits}")
    digest = hashlib.sha256("/".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[: (bits + 7) // 8], "big") & ((1 << bits) - 1)


def derive_rng(*parts: object) -> random.Random:
    """A local RNG seeded with the 64-bit `derive_seed` of `parts`."""
    return random.Random(derive_seed(*parts, bits=RNG_SEED_BITS))
