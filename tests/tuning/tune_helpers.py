"""A scripted world whose score depends on the numeric policy parameters, and study specs.

The environment is the optimizer tests' (values named verbatim in the messages; period 0
has 2 sessions, periods 1 and 2 one each; with 2 rounds in period 0 and 1 afterwards a user
sends 8 + 2 + 2 messages). The scripted agent:

- write: stores the latest mentioned value of each variable, but only from a batch of
  exactly `TARGET_BATCH` messages (anything else: no update) -> only update_every = 4 writes;
- choice (questions and probes): the option mentioned latest in memory, plus the recent
  conversation when it shows at most `MAX_CONVERSATION` messages (a longer one "confuses"
  it and is ignored);
- upper bound (state given): always right, so the memory score is defined.

With update_every in {2, 4, 8} and short_term_len in {0, 4, 8} exactly one setting scores
1.0: update_every = 4, short_term_len = 0 (every write happens and the conversation shown is
short); the others score less, non-monotonically in each parameter.
"""

from __future__ import annotations

import re
import textwrap
import time
from pathlib import Path
from typing import Any

from optimize.evolve_helpers import SCHEMA, _latest_option, output_fields, sections
from optimize.evolve_helpers import write_environment as write_environment  # re-export
from scripted_lm import ScriptedLM, scripted_role_lms, user_turn

from evolve.tuning import load_study_spec, run_study

TARGET_BATCH = 4
MAX_CONVERSATION = 4
BEST = {"update_every": 4, "short_term_len": 0}
PAPER_GRID = "update_every = [2, 4, 8]\nshort_term_len = [0, 4, 8]"
# The [tuning] lines of a grid study over PAPER_GRID (9 points).
GRID = f'sampler = "grid"\n[tuning.parameters]\n{PAPER_GRID}'

_MESSAGE = re.compile(r"^(?:User|Assistant): ", re.M)


def count_messages(text: str) -> int:
    return len(_MESSAGE.findall(text))


def make_tuned_agent(delay_s: float = 0.0):
    def agent(call) -> dict[str, Any]:
        if delay_s:
            time.sleep(delay_s)  # lets two worker processes overlap
        fields = output_fields(call.system)
        inputs = sections(call.user)
        if "choice" in fields and "known_state" in inputs:
            return {"choice": _latest_option(inputs["known_state"], inputs["options"])}
        if "choice" in fields:
            context = inputs.get("memory", "")
            conversation = inputs.get("conversation", "")
            if count_messages(conversation) <= MAX_CONVERSATION:
                context += "\n" + conversation
            return {"choice": _latest_option(context, inputs["options"])}
        if "updates" in fields:
            text = inputs.get("messages", "")
            if count_messages(text) != TARGET_BATCH:
                return {"updates": []}
            lowered = text.lower()
            updates = []
            for variable, values in SCHEMA.items():
                found = [(lowered.rfind(v.lower()), v) for v in values if v.lower() in lowered]
                if found:
                    updates.append({"label": variable, "value": max(found)[1]})
            return {"updates": updates}
        return {name: "Noted." for name in fields}

    return agent


class TuneWorld:
    """Scripted LMs (agent keyed on the parameters) with their call logs."""

    def __init__(self, delay_s: float = 0.0) -> None:
        self.agent = ScriptedLM(make_tuned_agent(delay_s), model="agent-model")
        self.simulator = ScriptedLM(
            lambda call: user_turn("Thanks, tell me more."), model="simulator-model"
        )
        self.lms = scripted_role_lms(simulator=self.simulator, agent=self.agent)


def write_tune_spec(
    directory: Path,
    tuning: str,
    *,
    name: str = "tune",
    body: str = "",
    seed: int = 7,
    **tables: str,
) -> Path:
    """A study spec next to an environment file; `tables` replace the default tables.

    The study storage defaults to a sqlite file in `directory`.
    """
    directory.mkdir(parents=True, exist_ok=True)
    env_file = write_environment(directory / "env.json")
    tuning_text = textwrap.dedent(tuning).strip()
    if "storage" not in tuning_text:
        tuning_text = f'storage = "sqlite:///{directory / "optuna.db"}"\n{tuning_text}'
    defaults = {
        "environment": f"""
            file = "{env_file.name}"
            train_users = 2
            heldout_users = 1
        """,
        "episode": "rounds_initial = 2\nrounds_update = 1",
        "policy": 'kind = "in_context"',
        "tracking": "enabled = false",
    }
    defaults.update(tables)
    text = f'name = "{name}"\nseed = {seed}\nconcurrency = 1\n{textwrap.dedent(body)}\n'
    for table, content in defaults.items():
        text += f"\n[{table}]\n{textwrap.dedent(content).strip()}\n"
    # [tuning] last: its sub-tables ([tuning.parameters], [tuning.pruner]) follow it.
    text += f"\n[tuning]\n{tuning_text}\n"
    path = directory / f"{name}.toml"
    path.write_text(text, encoding="utf-8")
    return path


def tune(tmp_path: Path, spec_path: Path, world: TuneWorld | None = None, **kwargs: Any):
    """Run (or resume) the study of `spec_path` under `tmp_path` with scripted LMs; returns
    (result, world). `spec=` passes an already loaded spec instead of reading the file."""
    world = world or TuneWorld()
    result = run_study(
        kwargs.pop("spec", None) or load_study_spec(spec_path),
        world.lms,
        runs_dir=tmp_path / "runs",
        upper_bound_cache=tmp_path / "ub",
        **kwargs,
    )
    return result, world
