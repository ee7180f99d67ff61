"""The one seed derivation (`evolve.core.seeds`) reproduces both widths evolve derived before it."""

from __future__ import annotations

import hashlib
import random

import pytest

from evolve.core.seeds import derive_rng, derive_seed

PARTS = [(0,), (7, "trial", 3), ("user", 3, 12), ("personas", 0), (1, "u000-x", "answers", 2)]


def _sha(parts: tuple[object, ...]) -> bytes:
    return hashlib.sha256("/".join(str(part) for part in parts).encode("utf-8")).digest()


@pytest.mark.parametrize("parts", PARTS)
def test_31_bit_seed_is_the_first_four_digest_bytes_without_the_sign_bit(parts):
    expected = int.from_bytes(_sha(parts)[:4], "big") & 0x7FFFFFFF
    assert derive_seed(*parts) == expected
    assert 0 <= derive_seed(*parts) < 2**31


@pytest.mark.parametrize("parts", PARTS)
def test_rng_is_seeded_with_the_first_eight_digest_bytes(parts):
    expected = int.from_bytes(_sha(parts)[:8], "big")
    assert derive_seed(*parts, bits=64) == expected
    assert derive_rng(*parts).random() == random.Random(expected).random()


def test_pinned_values_do_not_drift():
    assert derive_seed(0, "trial", 1) == 2043471749
    assert derive_seed("personas", 0, bits=64) == 1520425837644375942


def test_seed_width_outside_the_digest_is_refused():
    with pytest.raises(ValueError, match="1..256 bits, got 0"):
        derive_seed(1, bits=0)
