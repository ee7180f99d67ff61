"""Which types list would have kept a held-out user's facts where the read finds them? The
quotes write and read replayed, without any LLM, over the held-out users' recorded base
conversations of a `quickstart_seeds.py` runs directory.

For each seed (run directories `<name>-s<seed>` and `<name>-s<seed>-blind`), the base's
held-out conversations are fed period by period to `in_context_quotes` (the shipped class, the
run's parameters) with each types list below; after each period, for every question, the
sentence that revealed the variable's current value (`filing_replay.revealing_events`) is
looked up: `kept` (memory holds it) and `shown` (the read, given the question and its options,
shows it: what the answer step can use). Lists: the base, the shipped run's best, the blind
control's best, and `complete` (one line per domain of the world's users, naming its facts by
their catalog labels).

Off-policy: on-policy, another list changes the assistant's replies and so the simulated
user's follow-ups; the opening messages, which reveal the values, are the same.

    .venv/bin/python benchmarks/types_list_replay.py benchmarks/records/quickstart_seeds
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from filing_replay import CachedEmbedder, holds, replayed_periods  # noqa: E402

from evolve.simulator.synthesis.catalogs import load_catalog  # noqa: E402
from memory_policies.in_context_quotes import TYPES_COMPONENT, InContextQuotesPolicy  # noqa: E402
from memory_policies.messages import render_options  # noqa: E402


def candidate(run: Path, candidate_id: str) -> dict:
    return json.loads((run / "candidates" / candidate_id / "candidate.json").read_text())


def best_list(run: Path) -> str:
    result = json.loads((run / "result.json").read_text())
    return candidate(run, result["best_id"])["components"][TYPES_COMPONENT]


def heldout_runs(run: Path) -> list[Path]:
    """The base's held-out evaluation, one run directory per user."""
    fingerprint = candidate(run, "g00-c0")["fingerprint"]
    return sorted((run / "evaluations" / "heldout" / fingerprint).iterdir())


def complete_list(catalog, user_runs: list[Path]) -> str:
    domains: set[str] = set()
    for user_run in user_runs:
        for user in json.loads((user_run / "environment.json").read_text()):
            domains |= {catalog.variables[var].domain for var in user["state_schema"]}
    lines = []
    for domain in sorted(domains):
        labels = sorted(v.label for v in catalog.variables.values() if v.domain == domain)
        lines.append(
            f"{len(lines) + 1}. {domain.replace('_', ' ').capitalize()}: {', '.join(labels)}"
        )
    return "\n".join(lines)


def replay(catalog, embedder, types: str, user_runs: list[Path], tally: Counter) -> None:
    for user_run in user_runs:
        parameters = json.loads((user_run / "run.json").read_text())["config"]["policy"][
            "parameters"
        ]
        policy = InContextQuotesPolicy(embedder=embedder, **parameters).with_components(
            {TYPES_COMPONENT: types}
        )
        for user_dir in sorted((user_run / "users").iterdir()):
            for period_dir, state, so_far in replayed_periods(catalog, policy, user_dir):
                result = json.loads((period_dir / "result.json").read_text())
                for item in result["items"]:
                    variable = item["required_info"][0]
                    said = [e for e in so_far if e["variable"] == variable]
                    tally["questions"] += 1
                    if not said or said[-1]["value"] != result["state"][variable]:
                        tally["unrevealed"] += 1
                        continue
                    sentence = said[-1]["sentence"]
                    tally["kept"] += holds(state.memory, sentence) is not None
                    query = f"{item['question']}\n{render_options(item['options'])}"
                    _, shown = policy._use_inputs(state, query)
                    tally["shown"] += any(sentence in text for text in shown)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs_dir", type=Path, help="a quickstart_seeds.py --runs-dir")
    args = parser.parse_args()
    catalog = load_catalog()
    embedder = CachedEmbedder()
    shipped = sorted(run for run in args.runs_dir.iterdir() if re.search(r"-s\d+$", run.name))
    tallies: dict[str, Counter] = {}
    for run in shipped:
        user_runs = heldout_runs(run)
        blind = run.with_name(f"{run.name}-blind")
        lists = {
            "base": candidate(run, "g00-c0")["components"][TYPES_COMPONENT],
            "best": best_list(run),
            "blind best": best_list(blind) if (blind / "result.json").exists() else None,
            "complete": complete_list(catalog, user_runs),
        }
        for name, types in lists.items():
            if types is not None:
                replay(catalog, embedder, types, user_runs, tallies.setdefault(name, Counter()))
    print(f"{args.runs_dir}: seeds {', '.join(run.name for run in shipped)} (held-out users)")
    print(f"{'types list':<12} {'questions':>9} {'kept':>6} {'shown':>6}")
    for name, tally in tallies.items():
        n = max(tally["questions"], 1)
        kept, shown = tally["kept"] / n, tally["shown"] / n
        print(f"{name:<12} {tally['questions']:>9} {kept:>6.2f} {shown:>6.2f}")


if __name__ == "__main__":
    main()
