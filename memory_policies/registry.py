"""Build policies one way from a spec string, a mapping or a saved bundle."""

from __future__ import annotations

import importlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memory_policies.base import BUNDLE_FILE, BUNDLE_FORMAT, BUNDLE_FORMAT_VERSION, MemoryPolicy
from memory_policies.embed import Embedder
from memory_policies.errors import PolicyError
from memory_policies.external import ExternalPolicy
from memory_policies.in_context import InContextOraclePolicy, InContextPolicy
from memory_policies.in_context_quotes import InContextQuotesPolicy
from memory_policies.mem0_system import Mem0Policy
from memory_policies.native import NativePolicy
from memory_policies.raw_rag import RawRagPolicy
from memory_policies.variants import (
    EVOLVE,
    VARIANTS,
    check_variant,
    is_variant,
    pop_variant,
    renamed_option_error,
)

logger = logging.getLogger(__name__)

POLICY_KINDS: dict[str, type[MemoryPolicy]] = {}


def register_policy(cls: type[MemoryPolicy]) -> type[MemoryPolicy]:
    """Add a policy class to the registry (built-ins go through this too); usable as decorator."""
    existing = POLICY_KINDS.get(cls.kind)
    if existing is not None and existing is not cls:
        raise PolicyError(f"policy kind '{cls.kind}' is already registered by {existing.__name__}")
    POLICY_KINDS[cls.kind] = cls
    return cls


# mem0 is registered without being imported: building a `mem0` policy checks the extra.
for _cls in (
    NativePolicy,
    InContextPolicy,
    ExternalPolicy,
    RawRagPolicy,
    Mem0Policy,
    InContextOraclePolicy,
    InContextQuotesPolicy,
):
    register_policy(_cls)


PLUGINS_ENV = "MEMORY_POLICIES_PLUGINS"
_plugins_loaded = False


def load_plugins() -> None:
    """Import the modules named in $MEMORY_POLICIES_PLUGINS (comma-separated), once.

    A plugin module registers its kinds with `register_policy` when imported, so a one-file
    policy or memory system works wherever specs are built, the `evolve` CLI included.
    """
    global _plugins_loaded
    if _plugins_loaded:
        return
    for name in filter(None, (part.strip() for part in os.environ.get(PLUGINS_ENV, "").split(","))):
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise PolicyError(
                f"cannot import policy plugin module {name!r} named in ${PLUGINS_ENV}: {exc}; "
                "put its directory on PYTHONPATH or fix the name"
            ) from exc
    _plugins_loaded = True


def _valid_kinds() -> str:
    return ", ".join(POLICY_KINDS)


def _spec_help() -> str:
    return (
        f"expected a policy kind ({_valid_kinds()}) optionally with parameters, e.g. "
        "'in_context:update_every=2,short_term_len=4' or 'external:variant=paper', or a bundle "
        "directory holding "
        f"{BUNDLE_FILE}"
    )


def create_policy(
    kind: str,
    parameters: Mapping[str, Any] | None = None,
    *,
    components: Mapping[str, str] | None = None,
    embedder: Embedder | None = None,
    variant: str | None = None,
) -> MemoryPolicy:
    """Build a policy of `kind`; `variant` ('paper' or 'evolve', default the class's 'evolve')
    may also be given as ``parameters["variant"]`` (what a spec string yields)."""
    load_plugins()
    cls = POLICY_KINDS.get(kind)
    if cls is None:
        raise PolicyError(f"unknown policy kind {kind!r}; valid kinds: {_valid_kinds()}")
    params = dict(parameters or {})
    variant = pop_variant(kind, params, variant)
    if variant is not None:
        params["variant"] = check_variant(kind, variant)
    policy = cls(**params, embedder=embedder) if cls.uses_embedder else cls(**params)
    if components:
        policy = policy.with_components(components)
    return policy


def _looks_like_path(spec: str) -> bool:
    return "/" in spec or os.sep in spec or spec.endswith(".json") or Path(spec).exists()


_SWITCH_VALUES = {"true": True, "false": False}


def parse_spec(spec: str) -> tuple[str, dict[str, int | bool | str]]:
    """'kind:name=value,name=value' -> (kind, parameters): integers, true/false for
    switches (e.g. 'mem0:infer=false'), or the variant name ('in_context:variant=paper');
    a registered kind's switches are read as the type of their default, and the policy
    class checks the rest."""
    kind, _, params_text = spec.strip().partition(":")
    kind = kind.strip()
    if not kind:
        raise PolicyError(f"empty policy spec {spec!r}; {_spec_help()}")
    parameters: dict[str, int | bool | str] = {}
    for item in filter(None, (part.strip() for part in params_text.split(","))):
        name, eq, value = item.partition("=")
        name, value = name.strip(), value.strip()
        if not eq or not name:
            raise PolicyError(
                f"cannot read {item!r} in policy spec {spec!r}: parameters are name=value pairs "
                "separated by commas"
            )
        if name == "preset":
            raise renamed_option_error(kind, value)
        if name in parameters:
            raise PolicyError(f"parameter '{name}' is given twice in policy spec {spec!r}")
        if name == "variant":
            if not is_variant(value):
                raise PolicyError(
                    f"variant in policy spec {spec!r} must be one of {', '.join(VARIANTS)}, "
                    f"got {value!r}"
                )
            parameters[name] = value
            continue
        # A policy's switches (e.g. mem0's infer) say which type they take; the rest are
        # numeric parameters.
        default = getattr(POLICY_KINDS.get(kind), "option_defaults", {}).get(name)
        if isinstance(default, str):
            parameters[name] = value
            continue
        if isinstance(default, bool):
            if value.lower() not in _SWITCH_VALUES:
                raise PolicyError(
                    f"switch '{name}' in policy spec {spec!r} takes true or false, got {value!r} "
                    f"(e.g. {kind}:{name}=false)"
                )
            parameters[name] = _SWITCH_VALUES[value.lower()]
            continue
        if value.lower() in _SWITCH_VALUES:
            parameters[name] = _SWITCH_VALUES[value.lower()]
            continue
        try:
            parameters[name] = int(value)
        except ValueError:
            raise PolicyError(
                f"parameter '{name}' in policy spec {spec!r} must be an integer, got {value!r} "
                "(switches such as mem0's infer take true or false)"
            ) from None
    return kind, parameters


def build_policy(
    spec: str | os.PathLike[str] | Mapping[str, Any],
    *,
    embedder: Embedder | None = None,
    default_variant: str | None = None,
) -> MemoryPolicy:
    """Build a policy from a spec string, a bundle path, or a mapping.

    Mappings: ``{"kind": "external", "top_k": 3}`` (parameters inline or under
    ``"parameters"``, optional ``"components"`` and ``"variant"``), or
    ``{"path": "<bundle dir>"}``. `default_variant` applies when a kind spec names no variant
    (an evaluation protocol's default); a variant in the spec, or a bundle's, always wins.
    """
    if isinstance(spec, os.PathLike):
        return load(spec, embedder=embedder)
    load_plugins()
    if isinstance(spec, str):
        head = spec.strip().split(":", 1)[0]
        if head and head not in POLICY_KINDS and _looks_like_path(spec):
            return load(spec, embedder=embedder)
        kind, parameters = parse_spec(spec)
        if kind not in POLICY_KINDS:
            raise PolicyError(f"unknown policy kind {kind!r} in spec {spec!r}; {_spec_help()}")
        variant = pop_variant(kind, parameters)
        return create_policy(
            kind,
            parameters,
            embedder=embedder,
            variant=default_variant if variant is None else variant,
        )
    if isinstance(spec, Mapping):
        data = dict(spec)
        if "path" in data:
            extra = sorted(set(data) - {"path"})
            if extra:
                raise PolicyError(f"a bundle spec takes only 'path', also got {extra}")
            return load(data["path"], embedder=embedder)
        if "kind" not in data:
            raise PolicyError(f"policy mapping {data!r} has no 'kind'; {_spec_help()}")
        kind = data.pop("kind")
        components = data.pop("components", None)
        parameters = dict(data.pop("parameters", None) or {})
        overlap = sorted(set(parameters) & set(data))
        if overlap:
            raise PolicyError(f"parameter(s) {overlap} given both inline and under 'parameters'")
        parameters.update(data)
        variant = pop_variant(kind, parameters)
        return create_policy(
            kind,
            parameters,
            components=components,
            embedder=embedder,
            variant=default_variant if variant is None else variant,
        )
    raise PolicyError(f"cannot build a policy from {type(spec).__name__}; {_spec_help()}")


def bundle_path(directory: str | os.PathLike[str]) -> Path:
    path = Path(directory)
    return path / BUNDLE_FILE if path.is_dir() or path.suffix != ".json" else path


def read_bundle(directory: str | os.PathLike[str]) -> dict[str, Any]:
    path = bundle_path(directory)
    if not path.is_file():
        raise PolicyError(
            f"no policy bundle at {path}; pass a directory written by policy.save() "
            f"(it holds {BUNDLE_FILE})"
        )
    try:
        bundle = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise PolicyError(f"{path}: not a UTF-8 text file; is it really a policy bundle?") from None
    except RecursionError:
        raise PolicyError(f"{path}: policy bundle is nested too deeply to read") from None
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, or an over-long integer
        detail = " ".join(str(exc).split())[:300]
        raise PolicyError(f"cannot read policy bundle {path}: {detail}") from None
    if not isinstance(bundle, dict) or bundle.get("format") != BUNDLE_FORMAT:
        raise PolicyError(f"{path} is not a memory-policy bundle (expected format {BUNDLE_FORMAT})")
    version = bundle.get("format_version")
    if not isinstance(version, int) or version > BUNDLE_FORMAT_VERSION:
        raise PolicyError(
            f"{path} has bundle format version {version!r}; this memory_policies reads versions "
            f"up to {BUNDLE_FORMAT_VERSION}: upgrade memory_policies"
        )
    missing = [k for k in ("kind", "parameters", "components", "dspy_state") if k not in bundle]
    if missing:
        raise PolicyError(f"policy bundle {path} lacks field(s) {missing}")
    if "preset" in bundle and "variant" not in bundle:
        # Version 1 bundles record the variant under its old name. Read silently: a warning
        # is for what the user writes, and nobody can fix a bundle already exported.
        bundle["variant"] = bundle.pop("preset")
    return bundle


def load(directory: str | os.PathLike[str], *, embedder: Embedder | None = None) -> MemoryPolicy:
    """Rebuild a saved policy: same kind, parameters, instructions and DSPy state."""
    bundle = read_bundle(directory)
    # Bundles written before variants existed used the only flow there was: 'evolve'.
    policy = create_policy(
        bundle["kind"],
        bundle["parameters"],
        embedder=embedder,
        variant=bundle.get("variant") or EVOLVE.name,
    )
    try:
        policy.load_state(bundle["dspy_state"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyError(
            f"the DSPy state in bundle {bundle_path(directory)} does not fit a "
            f"'{bundle['kind']}' policy: {exc!r}"
        ) from exc
    # `components` is the human-readable copy of the instructions; it wins, so a hand edit of
    # policy.json takes effect.
    policy = policy.with_components(bundle["components"])
    recorded = bundle.get("embedder")
    if recorded is not None and policy.uses_embedder and policy.embedder_name() != recorded:
        logger.warning(
            "policy bundle was saved with embedder %r, now using %r; memory states made with "
            "the old embedder cannot be resumed with this policy",
            recorded,
            policy.embedder_name(),
        )
    return policy
