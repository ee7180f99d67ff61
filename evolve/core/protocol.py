"""Which information flow an evaluation or evolution follows (a leaf module: pydantic only).

- ``"paper"`` reproduces the reference AMemGym code's information flow (what each role is
  shown, rounds, agent I/O, probes, feedback), so numbers sit next to the paper's. It does
  not reproduce the reference code's bugs; every remaining difference is a row of
  `evolve/spec/paper_deviations.toml` (rendered in docs/reference/paper-deviations.md).
- ``"evolve"`` is this toolkit's own flow (state-aware simulated user, per-variable probes,
  failure-diagnostic feedback, held-out users).

The protocol is part of every run's identity, even when left at its default.

Every choice that differs between the two flows is a field of `ProtocolRules`. A name becomes
its rules once, where it enters: a spec or an episode config validates its `protocol` into a
`rules` attribute (`RulesField`), and the command layer looks up a name it was given
(`rules_for`). Everything below reads the object it is handed (``config.rules.probe_style``):
code never compares a protocol name or looks one up. A new difference is a new field with a
value for each protocol, documented here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import PlainSerializer, PlainValidator
from pydantic.json_schema import SkipJsonSchema

Protocol = Literal["paper", "evolve"]
PROTOCOLS: tuple[Protocol, ...] = ("paper", "evolve")
# The protocol of a spec, an episode or a stored record that does not name one.
DEFAULT_PROTOCOL: Protocol = "evolve"
# `evolve eval` without --protocol: its numbers sit next to the published ones.
EVAL_COMMAND_PROTOCOL: Protocol = "paper"


@dataclass(frozen=True)
class ProtocolRules:
    """What one protocol decides. One instance per protocol; look it up with `rules_for`."""

    name: Protocol
    # Rounds per session (period 0, later periods) when a data file does not say: the paper's
    # v1.base uses 1 then 2; ours keeps 1/1 unless the spec sets them.
    data_file_rounds: tuple[int, int]
    # The policy variant a policy spec naming none gets (`memory_policies.variants`): the
    # paper protocol's agents talk as the reference agents do; ours leaves each kind's own
    # default.
    policy_variant: str | None
    # A spec's data file stands for the published AMemGym data.json, so a missing one is
    # explained with where to download it (ours names any data file).
    data_file_is_published: bool
    # Probe scopes a spec may choose (the first is the default) and why others are refused:
    # the original's diagnosis probes every question whether answered right or not.
    probe_scopes: tuple[str, ...]
    probe_scope_reason: str
    # How recall is probed after the questions: one structured probe per question over its
    # required variables (the reference's), or one multiple-choice probe per variable (ours).
    # The simulator maps the name to its probe strategy.
    probe_style: Literal["per_question", "per_variable"]
    # What the simulated user may see: only the profile, dates, the opening message, the last
    # two messages and the schema ("state_hidden", the reference's), or also the period's state so
    # follow-ups stay consistent with it ("state_aware"). The simulator maps it to a view.
    user_view: Literal["state_hidden", "state_aware"]
    # The upper bound's prompt layout: the reference's (state as indented JSON, options as
    # ``<n>: <text>``) or ours (compact). Each layout has its own cache.
    upper_bound_layout: Literal["reference", "compact"]
    # Evolution feedback named "complete" is the paper's (no ground truth); ours was renamed
    # "diagnostic", so "complete" is refused with a pointer to it.
    complete_feedback_allowed: bool
    # The reflector defaults to the agent's own model at temperature 0 (the paper's), and its
    # role, model and temperature are then part of the experiment's identity.
    reflector_is_agent_model: bool
    # The reflector's prompt: "reference" = the reference's content (an empty system message,
    # improve the part from the feedback in a similar format, no length cap); "hinted" = ours
    # (failures must not happen again, store changed facts, stay general, at most 120 words).
    reflector_prompt: Literal["reference", "hinted"]
    # Structured list edits (the `list_edit` operator) and proposal checks (edits.py): built
    # for the bundled small model; the reference uses the reflector's text as it is.
    structured_edits: bool
    # Completion limit of the agent and the simulated user when neither the spec nor the
    # command line sets one: the reference's configs use 8192; None = the endpoint's own.
    default_max_tokens: int | None
    # MetricSummary field printed as "the paper's number" of a per-period chain: the
    # reference's plain mean with random fallback, or our memory score.
    headline_memory_score: Literal["memory_score_original", "memory_score"]
    # Print the kept rows of evolve/spec/paper_deviations.toml before a run's first call.
    prints_deviations: bool
    # Sampling temperature of the simulated user when neither the spec nor the endpoint sets
    # one: the reference's env config samples it at 0.2; None = the endpoint's own (0).
    default_user_temperature: float | None
    # A policy that embeds (AWE, RAG) needs its embedder named ($MEMORY_POLICIES_EMBEDDER):
    # the default local MiniLM is not the paper's text-embedding-3-small.
    requires_named_embedder: bool
    # An unset `max_feedback_chars` still caps the chain's feedback (ours, for small models'
    # context); the reference caps no feedback, so under paper only a value the spec sets does.
    feedback_capped_by_default: bool


PAPER = ProtocolRules(
    name="paper",
    data_file_rounds=(1, 2),
    policy_variant="paper",
    data_file_is_published=True,
    probe_scopes=("all",),
    probe_scope_reason="the original's diagnosis probes every question whether answered right "
    "or not",
    probe_style="per_question",
    user_view="state_hidden",
    upper_bound_layout="reference",
    complete_feedback_allowed=True,
    reflector_is_agent_model=True,
    reflector_prompt="reference",
    structured_edits=False,
    default_max_tokens=8192,
    headline_memory_score="memory_score_original",
    prints_deviations=True,
    default_user_temperature=0.2,
    requires_named_embedder=True,
    feedback_capped_by_default=False,
)
EVOLVE = ProtocolRules(
    name="evolve",
    data_file_rounds=(1, 1),
    policy_variant=None,
    data_file_is_published=False,
    probe_scopes=("all", "wrong_only"),
    probe_scope_reason="",
    probe_style="per_variable",
    user_view="state_aware",
    upper_bound_layout="compact",
    complete_feedback_allowed=False,
    reflector_is_agent_model=False,
    reflector_prompt="hinted",
    structured_edits=True,
    default_max_tokens=None,
    headline_memory_score="memory_score",
    prints_deviations=False,
    default_user_temperature=None,
    requires_named_embedder=False,
    feedback_capped_by_default=True,
)
_RULES: dict[str, ProtocolRules] = {rules.name: rules for rules in (PAPER, EVOLVE)}


def rules_for(protocol: str) -> ProtocolRules:
    """The rules of a protocol by name; a ValueError naming the valid ones otherwise."""
    try:
        return _RULES[protocol]
    except KeyError:
        raise ValueError(
            f"unknown protocol {protocol!r}; expected one of {', '.join(PROTOCOLS)}"
        ) from None


ALL_RULES: tuple[ProtocolRules, ...] = tuple(_RULES.values())
DEFAULT_RULES = _RULES[DEFAULT_PROTOCOL]


def _as_rules(value: object) -> ProtocolRules:
    if isinstance(value, ProtocolRules):
        return value
    if isinstance(value, str):
        return rules_for(value)
    raise ValueError(f"expected a protocol name ({', '.join(PROTOCOLS)}), got {value!r}")


# A model attribute holding a protocol's rules, derived from the model's `protocol` name when
# it is validated (see `with_rules`); left out of dumps, hashes and JSON schemas (the name is
# what is stored).
RulesField = SkipJsonSchema[
    Annotated[
        ProtocolRules,
        PlainValidator(_as_rules),
        PlainSerializer(lambda rules: rules.name, return_type=str),
    ]
]


def with_rules(data: Any, *, default: str = DEFAULT_PROTOCOL) -> Any:
    """A model's input with `rules` derived from its `protocol` (for a before-validator): the
    one place a stored or written protocol name becomes its rules. Given only `rules` (an
    object), `protocol` is its name; given both, they must agree."""
    if not isinstance(data, Mapping):
        return data
    data = dict(data)
    if "rules" not in data:
        data["rules"] = _as_rules(data.get("protocol", default))
    elif "protocol" not in data:
        data["protocol"] = _as_rules(data["rules"]).name
    elif _as_rules(data["rules"]) is not _as_rules(data["protocol"]):
        raise ValueError(f"protocol {data['protocol']!r} and rules {data['rules']} disagree")
    return data
