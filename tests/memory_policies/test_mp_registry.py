"""Policies are built one way from specs; invalid specs are refused with the valid choices."""

from __future__ import annotations

import subprocess
import sys

import pytest

from memory_policies import (
    POLICY_KINDS,
    ExternalPolicy,
    InContextOraclePolicy,
    InContextPolicy,
    InContextQuotesPolicy,
    Mem0Policy,
    NativePolicy,
    PolicyError,
    RawRagPolicy,
    build_policy,
)


def test_builtin_kinds_are_registered() -> None:
    expected = {
        "native": NativePolicy,
        "in_context": InContextPolicy,
        "in_context_oracle": InContextOraclePolicy,
        "in_context_quotes": InContextQuotesPolicy,
        "external": ExternalPolicy,
        "raw_rag": RawRagPolicy,
        "mem0": Mem0Policy,
    }
    assert expected == POLICY_KINDS


@pytest.mark.parametrize(
    ("spec", "cls", "params"),
    [
        ("native", NativePolicy, {}),
        ("in_context", InContextPolicy, {"update_every": 2, "short_term_len": 4}),
        (
            "in_context:update_every=3,short_term_len=0",
            InContextPolicy,
            {"update_every": 3, "short_term_len": 0},
        ),
        (
            " external : top_k = 7 ",
            ExternalPolicy,
            {"update_every": 2, "short_term_len": 4, "top_k": 7},
        ),
        (
            {"kind": "raw_rag", "top_k": 2},
            RawRagPolicy,
            {"update_every": 2, "short_term_len": 4, "top_k": 2},
        ),
        (
            {"kind": "in_context", "parameters": {"update_every": 5}},
            InContextPolicy,
            {"update_every": 5, "short_term_len": 4},
        ),
    ],
)
def test_specs_build_policies(spec, cls, params) -> None:
    policy = build_policy(spec)
    assert type(policy) is cls
    assert policy.parameters() == params


def test_mapping_spec_can_set_components() -> None:
    policy = build_policy({"kind": "native", "components": {"use": "Be brief."}})
    assert policy.components() == {"use": "Be brief."}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("nonsense", r"unknown policy kind 'nonsense'.*native, in_context, external, raw_rag"),
        (
            "in_context:window=3",
            r"unknown parameter\(s\) \['window'\].*update_every.*short_term_len",
        ),
        ("native:update_every=1", r"valid parameters: none"),
        ("in_context:update_every=0", r"update_every' of policy 'in_context' must be at least 1"),
        ("in_context:short_term_len=-1", r"must be at least 0"),
        ("external:top_k=0", r"top_k' of policy 'external' must be at least 1"),
        # A typo-sized value would run and never write memory (or read every memory).
        (
            "in_context:update_every=99999999999999999999",
            r"update_every' of policy 'in_context' must be at most 1000 .*got 99999999999999999999",
        ),
        ("in_context:short_term_len=1001", r"short_term_len' .* must be at most 1000"),
        ("external:top_k=5000", r"top_k' of policy 'external' must be at most 1000"),
        ({"kind": "raw_rag", "update_every": 10**30}, r"update_every' .* must be at most 1000"),
        ("in_context:update_every=two", r"must be an integer, got 'two'"),
        ("in_context:update_every", r"name=value pairs"),
        ("in_context:update_every=1,update_every=2", r"given twice"),
        ("", r"empty policy spec"),
        ({"kind": "in_context", "update_every": True}, r"must be an integer"),
        ({"update_every": 1}, r"has no 'kind'"),
        ({"kind": "native", "parameters": {"a": 1}, "a": 2}, r"both inline and under"),
        (
            {"kind": "native", "components": {"write": "x"}},
            r"unknown component\(s\) \['write'\].*\['use'\]",
        ),
        (42, r"cannot build a policy from int"),
        ("./no/such/bundle", r"no policy bundle"),
    ],
)
def test_invalid_specs_are_refused(spec, match) -> None:
    with pytest.raises(PolicyError, match=match):
        build_policy(spec)


def test_with_parameters_validates_and_copies() -> None:
    policy = build_policy("external")
    tuned = policy.with_parameters(top_k=9)
    assert tuned.parameters()["top_k"] == 9 and policy.parameters()["top_k"] == 5
    with pytest.raises(PolicyError, match="must be at least 1"):
        policy.with_parameters(update_every=0)
    with pytest.raises(PolicyError, match="must be at most 1000"):
        policy.with_parameters(top_k=1001)
    with pytest.raises(PolicyError, match="unknown parameter"):
        policy.with_parameters(depth=2)


def test_building_an_embedding_policy_loads_no_model() -> None:
    # A fresh interpreter: other tests in this process may have loaded torch legitimately.
    code = (
        "import sys, memory_policies as mp\n"
        "p = mp.build_policy('external')\n"
        "assert p.embedder_name() == 'all-MiniLM-L6-v2'\n"
        "p.with_parameters(top_k=2).answer  # copies share the lazy embedder\n"
        "print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert result.stdout.strip() == "[]"
