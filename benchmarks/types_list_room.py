"""How much room does the quickstart leave for evolution? Its base types list against the ideal
one, on-policy, and where every wrong answer came from.

For each environment seed, builds the quickstart's world and base policy (`experiments/
quickstart.toml`, its LLM setup: the bundled 1.5B) and evaluates on-policy, on every user of
the world (train and held-out):

- `base`: the quickstart's base policy (its narrow types list);
- `ideal`: the same policy whose types list names every domain of the spec's recall world, with
  its facts (what a perfect evolution of `write.types_to_remember` could reach).

Per condition it prints accuracy, the upper bound and random, conversation health, and each
wrong answer's origin:

- `unrevealed`: no session up to the question's period exposed the variable's current value
  (the simulated user never said it);
- `write`: it was said, but the memory did not hold it (the toolkit's write failure);
- `read` / `use`: the memory held it and the answer missed it (read and utilization failures).

Runs resume (results under --out); a rerun only prints.

    .venv/bin/python benchmarks/types_list_room.py [--seeds 13 14 15] [--out runs/types_list_room]
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from evolve import api
from evolve.simulator.records import Diagnosis, ItemResult, UserResult
from evolve.simulator.synthesis.catalogs import load_catalog
from evolve.simulator.synthesis.presets import EVERYDAY_DOMAINS, get_preset
from evolve.spec.config import resolve

ROOT = Path(__file__).resolve().parents[1]
TYPES = "write.types_to_remember"


def ideal_types_list(domains: Sequence[str] = EVERYDAY_DOMAINS) -> str:
    """Every domain of a recall world (by default the quickstart's), with the facts it holds:
    a complete schema."""
    catalog = load_catalog()
    labels: dict[str, list[str]] = {}
    for spec in catalog.variables.values():
        if spec.recall and spec.domain in domains:
            labels.setdefault(spec.domain, []).append(spec.label)
    return "\n".join(
        f"{index}. {domain.replace('_', ' ').capitalize()}: {', '.join(sorted(set(names)))}"
        for index, (domain, names) in enumerate(sorted(labels.items()), start=1)
    )


def revealed_by(user: UserResult, period_index: int, variable: str, value: str) -> bool:
    """Whether a session of this user, up to `period_index`, exposed `variable` = `value`
    since the period that last set it (what the simulated user was asked to say)."""
    for period in reversed(user.periods[: period_index + 1]):
        if period.exposed_states.get(variable) == value:
            return True
        if variable in period.state_updates:  # set here and not said since
            return False
    return False


def origin(user: UserResult, period_index: int, item: ItemResult) -> str:
    if item.correct:
        return "right"
    state = user.periods[period_index].state
    if not all(revealed_by(user, period_index, v, state[v]) for v in item.required_info):
        return "unrevealed"
    return {
        Diagnosis.WRITE: "write",
        Diagnosis.READ: "read",
        Diagnosis.UTILIZATION: "use",
    }.get(item.diagnosis, str(item.diagnosis))


def current_sentence(user: UserResult, period_index: int, variable: str, catalog) -> str | None:
    """The catalog sentence that revealed `variable`'s current value last, up to the period
    (the opening query of the latest session that exposed it), or None."""
    value = user.periods[period_index].state.get(variable)
    spec = catalog.variables.get(variable)
    if spec is None or value is None:
        return None
    for period in reversed(user.periods[: period_index + 1]):
        for session in reversed(period.sessions):
            if session.exposed_states.get(variable) == value:
                said = [p for p in spec.values.get(value, []) if p in session.query]
                if said:
                    return said[0]
    return None


def read_showed_current(user: UserResult, period_index: int, item: ItemResult, catalog) -> bool:
    """Whether the read, for this question, showed the sentence that revealed each required
    fact's current value."""
    said = [current_sentence(user, period_index, v, catalog) for v in item.required_info]
    return all(s and any(s in text for text in item.retrieved) for s in said)


def shown_note(report, catalog) -> str:
    """How many questions the read showed the current value's sentence for, and how many of
    them (and of the others) were answered right."""
    counts: Counter = Counter()
    for user in report.users:
        for period in user.periods:
            for item in period.items:
                shown = read_showed_current(user, period.period_index, item, catalog)
                counts["shown" if shown else "not shown", item.correct] += 1
    return ", not for ".join(
        f"{counts[key, True] + counts[key, False]} (right {counts[key, True]})"
        for key in ("shown", "not shown")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "types_list_room")
    parser.add_argument("--threads", type=int, default=None, help="embedded server threads")
    parser.add_argument(
        "--off-policy",
        type=Path,
        default=None,
        help="replay the transcripts recorded under DIR/seed<N>/<condition> (a previous --out) "
        "instead of live sessions: compares writes on the same conversations, fast",
    )
    args = parser.parse_args()
    spec = api.load_spec(args.spec)
    if args.threads is not None:
        embedded = spec.llm.embedded.model_copy(update={"threads": args.threads})
        spec = spec.model_copy(update={"llm": spec.llm.model_copy(update={"embedded": embedded})})
    seeds = args.seeds or [spec.environment.seed + offset for offset in range(3)]
    ideal = ideal_types_list(get_preset(spec.environment.preset).domains or EVERYDAY_DOMAINS)
    catalog = load_catalog()
    print(f"ideal types list:\n{ideal}\n", flush=True)
    accuracy: dict[str, list[float]] = {"base": [], "ideal": []}
    for seed in seeds:
        seeded = spec.model_copy(
            update={"environment": spec.environment.model_copy(update={"seed": seed})}
        )
        resolved = resolve(seeded)
        policies = {
            "base": resolved.base_policy,
            "ideal": resolved.base_policy.with_components({TYPES: ideal}),
        }
        reports = api.evaluate_policies(
            resolved.environment,
            policies,
            args.out / f"seed{seed}",
            llm=seeded.llm,
            episode=resolved.episode,
            off_policy=args.off_policy / f"seed{seed}" / "ideal" if args.off_policy else None,
        )
        for name, report in reports.items():
            origins = Counter(
                origin(user, period.period_index, item)
                for user in report.users
                for period in user.periods
                for item in period.items
            )
            s = report.summary
            accuracy[name].append(s.accuracy or 0.0)
            shown = shown_note(report, catalog)
            print(
                f"seed {seed} {name:<5} accuracy {s.accuracy:.3f} on {s.n_items} questions "
                f"(upper bound {s.upper_bound_score:.3f}, random {s.random_score:.3f}); wrong: "
                + ", ".join(
                    f"{key} {origins[key]}" for key in ("unrevealed", "write", "read", "use")
                )
                + f"; the current value's sentence read for {shown}"
                + f"; {s.conversation.describe()}; {s.llm_calls} calls, {report.wall_time_s:.0f} s",
                flush=True,
            )
    gains = [i - b for b, i in zip(accuracy["base"], accuracy["ideal"], strict=True)]
    print(
        f"\nmean accuracy: base {statistics.fmean(accuracy['base']):.3f}, ideal "
        f"{statistics.fmean(accuracy['ideal']):.3f}; ideal - base "
        f"{statistics.fmean(gains):+.3f} (per seed {', '.join(f'{g:+.3f}' for g in gains)})"
    )


if __name__ == "__main__":
    main()
