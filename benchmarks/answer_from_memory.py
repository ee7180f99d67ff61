"""Where does the quickstart's 1.5B lose: filing, or answering? Its answer step given ideal
memories.

For each environment seed of a `types_list_room.py` run (its questions, options and gold
answers per user and period), the quickstart's base policy answers every question from a
memory built without any write:

- `ideal`: for each of the user's variables, the sentence of the latest session that revealed
  its current value (the catalog paraphrase in the session's opening message), filed under the
  variable's label ("sleep: I keep waking up through the night."): what a perfect write could
  store;
- `none`: an empty memory.

With `--lean`, only the ideal memory, answered by a lean prompt instead of the policy's answer
step: one system message with the memory lines, the question with numbered options as the user
message, a JSON-schema `{"choice": n}` reply (the shape that reached 0.75 in the issue that
set the quickstart's target), to tell the answer step's prompt from the model.

Questions are asked one at a time (deterministic at temperature 0), with no recent
conversation. Compare with the room run's `ideal` condition (the complete types list, written
by the policy on policy) and its upper bound (the state given).

    .venv/bin/python benchmarks/answer_from_memory.py --room runs/room_v4 [--seeds 13 14 15]
        [--lean]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from evolve import api
from evolve.llm import open_role_lms
from evolve.simulator.environment import EnvironmentItem
from evolve.simulator.synthesis.catalogs import load_catalog
from evolve.spec.config import resolve
from memory_policies.in_context import MemoryEntry

ROOT = Path(__file__).resolve().parents[1]


def ideal_entries(item: EnvironmentItem, period_index: int) -> list[MemoryEntry]:
    """Each variable's latest revealing sentence of its current value, up to the period."""
    catalog = load_catalog()
    state = item.periods[period_index].state
    latest: dict[str, MemoryEntry] = {}
    for period in item.periods[: period_index + 1]:
        for session in period.sessions:
            for variable, value in session.exposed_values().items():
                spec = catalog.variables.get(variable)
                if spec is None or state.get(variable) != value:
                    continue
                said = [p for p in spec.values.get(value, []) if p in session.query]
                if said:
                    latest[variable] = MemoryEntry(
                        label=spec.label, value=said[0], time=session.session_time
                    )
    return sorted(latest.values(), key=lambda entry: entry.time or "")


LEAN_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {
            "type": "object",
            "properties": {"choice": {"type": "integer"}},
            "required": ["choice"],
        },
    },
}


def lean_choice(lm, entries: list[MemoryEntry], question: str, options: list[str]) -> int | None:
    """The lean prompt's 1-based choice, None when its reply is not the schema's JSON."""
    memory = "\n".join(f"- [{e.time}] {e.label}: {e.value}" for e in entries)
    numbered = "\n".join(f"{index}. {option}" for index, option in enumerate(options, start=1))
    messages = [
        {
            "role": "system",
            "content": "You are a personal assistant. What you remember the user told you "
            f"(oldest first):\n{memory}",
        },
        {
            "role": "user",
            "content": f"{question}\n\nOptions:\n{numbered}\n\nAnswer with the number of the "
            'option that fits me now, as JSON {"choice": n}.',
        },
    ]
    reply = lm(messages=messages, response_format=LEAN_FORMAT, temperature=0)[0]
    text = reply if isinstance(reply, str) else reply.get("text", "")
    try:
        choice = json.loads(text)["choice"]
    except (ValueError, KeyError, TypeError):
        return None
    return choice if isinstance(choice, int) else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--room", type=Path, required=True, help="a types_list_room.py --out")
    parser.add_argument("--seeds", type=int, nargs="+", default=[13, 14, 15])
    parser.add_argument("--lean", action="store_true", help="the lean prompt on ideal memories")
    args = parser.parse_args()
    spec = api.load_spec(args.spec)
    conditions = ("ideal-lean",) if args.lean else ("ideal", "none")
    totals = {name: [0, 0] for name in conditions}
    with open_role_lms(spec.llm) as lms, lms.context("agent"):
        for seed in args.seeds:
            users = args.room / f"seed{seed}" / "ideal" / "users"
            if not users.is_dir():
                print(f"seed {seed}: no room run under {users}")
                continue
            seeded = spec.model_copy(
                update={"environment": spec.environment.model_copy(update={"seed": seed})}
            )
            resolved = resolve(seeded)
            policy = resolved.base_policy
            started = time.perf_counter()
            right = dict.fromkeys(conditions, 0)
            asked = 0
            user_dirs = sorted(users.iterdir())
            for item, user_dir in zip(resolved.environment.items, user_dirs, strict=True):
                for period_dir in sorted(user_dir.glob("period_*")):
                    result = json.loads((period_dir / "result.json").read_text())
                    period_index = result["period_index"]
                    ideal = ideal_entries(item, period_index)
                    memories = {"ideal": ideal, "none": []}
                    for question in result["items"]:
                        asked += 1
                        if args.lean:
                            chosen = lean_choice(
                                lms.lm("agent"), ideal, question["question"], question["options"]
                            )
                            right["ideal-lean"] += chosen == question["gold"]
                            continue
                        for name, entries in memories.items():
                            state = policy.initial_state()
                            state.memory = list(entries)
                            answer = policy.answer(state, question["question"], question["options"])
                            right[name] += answer.choice == question["gold"]
            for name in right:
                totals[name][0] += right[name]
                totals[name][1] += asked
            figures = ", ".join(
                f"{name} {right[name]}/{asked} = {right[name] / asked:.3f}" for name in conditions
            )
            print(f"seed {seed}: {figures} ({time.perf_counter() - started:.0f} s)", flush=True)
    print(
        "overall: "
        + ", ".join(f"{name} {r}/{n} = {r / max(n, 1):.3f}" for name, (r, n) in totals.items())
    )


if __name__ == "__main__":
    main()
