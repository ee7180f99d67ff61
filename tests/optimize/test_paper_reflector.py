"""The reflector under each protocol: paper sends the reference's content (an empty system
message, improve the text from the feedback in a similar format, no length cap) and refuses
structured edits; evolve keeps our hinted prompt and its checks."""

from __future__ import annotations

from pathlib import Path

import pytest
from optimize.evolve_helpers import write_spec
from scripted_lm import ScriptedLM, scripted_role_lms

from evolve.core.errors import ConfigError
from evolve.optimize.loop import build_reflector
from evolve.optimize.operators import check_operators
from evolve.optimize.reflect import REFLECTOR_PROMPTS, Reflector
from evolve.spec.config import load_spec, resolve

TYPES = "1. Diet: what the user eats.\n2. Home: where the user lives."
FEEDBACK = 'Question 1: "Can you suggest a dinner recipe for me?"\nThe assistant chose: (A)'
# Longer than the hinted prompt's 120 words: the reference caps nothing.
LONG_TEXT = "\n".join(f"{n}. Type {n}: " + "detail " * 12 for n in range(1, 16))
HINTS = ("120 words", "do not happen again", "stay general", "changed")


def propose(prompt: str, reply, max_chars: int | None = None):
    agent = ScriptedLM(reply, model="agent-model")
    lms = scripted_role_lms(agent=agent)
    reflector = Reflector(
        lms,
        temperature=0.0,
        max_chars=max_chars,
        role="agent",
        check_proposals=prompt == "hinted",
        prompt=REFLECTOR_PROMPTS[prompt],
    )
    proposal = reflector.propose("write.types_to_remember", TYPES, FEEDBACK, rollout_id=1, seed=1)
    (call,) = agent.calls
    return proposal, call


def test_paper_reflector_sends_the_reference_content_without_a_cap():
    proposal, call = propose("reference", lambda call: {"new_text": LONG_TEXT, "changes": []})
    assert call.messages[0] == {"role": "system", "content": ""}
    assert len(call.messages) == 2 and call.messages[1]["role"] == "user"
    request = call.messages[1]["content"]
    assert TYPES in request and FEEDBACK in request
    assert "types of information to remember" in request and "similar format" in request
    for hint in HINTS:
        assert hint not in request
    assert "response_format" not in call.settings  # the reference asks in plain text
    assert len(LONG_TEXT.split()) > 120
    assert proposal.text == LONG_TEXT.strip() and proposal.error is None


def test_paper_reflector_reads_a_fenced_reply_and_counts_an_unreadable_one():
    fenced = '```json\n{"new_text": "1. Pets", "changes": ["added pets"]}\n```'
    proposal, _ = propose("reference", lambda call: fenced)
    assert proposal.text == "1. Pets"
    broken, _ = propose("reference", lambda call: "I would add pets.")
    assert broken.text is None and broken.parse_failed


def test_evolve_reflector_keeps_the_hinted_prompt():
    proposal, call = propose("hinted", lambda call: {"new_text": TYPES}, max_chars=1200)
    assert call.system.strip()  # a DSPy signature's system message
    for hint in HINTS:
        assert hint in call.text
    too_long, _ = propose("hinted", lambda call: {"new_text": LONG_TEXT}, max_chars=200)
    assert too_long.text is None and "max_instruction_chars" in too_long.error


@pytest.mark.parametrize(
    ("protocol", "prompt", "max_chars", "checks"),
    [("paper", "reference", None, False), ("evolve", "hinted", 1200, True)],
)
def test_the_experiment_builds_its_protocols_reflector(
    tmp_path: Path, protocol, prompt, max_chars, checks
):
    spec = load_spec(write_spec(tmp_path, f'protocol = "{protocol}"'))
    reflector = build_reflector(resolve(spec).spec, scripted_role_lms())
    assert (reflector.prompt, reflector.max_chars, reflector.check_proposals) == (
        REFLECTOR_PROMPTS[prompt],
        max_chars,
        checks,
    )


def test_structured_edits_are_refused_under_paper(tmp_path: Path):
    optimizer = """
        generations = 2
        reflection_minibatch_size = 2
        operators = ["list_edit", "reflective"]
        mutate_components = ["write.types_to_remember", "use"]
    """
    # The operator's own check, run before any LLM call (evolve_policy calls it).
    paper = resolve(load_spec(write_spec(tmp_path, 'protocol = "paper"', optimizer=optimizer)))
    with pytest.raises(ConfigError, match="list_edit .* not part of protocol 'paper'"):
        check_operators(paper.spec.optimizer, paper.rules, label="exp.toml")
    evolve = resolve(load_spec(write_spec(tmp_path, 'protocol = "evolve"', optimizer=optimizer)))
    check_operators(evolve.spec.optimizer, evolve.rules, label="exp.toml")  # ours: allowed
