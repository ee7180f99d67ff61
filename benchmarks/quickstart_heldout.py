"""The quickstart's base, best and blind control on more held-out users: its held-out figures
with a narrower error bar.

The quickstart holds out two users a seed (48 questions). A figure over so few users moves
with which values they happen to hold: with no memory the 1.5B still picks one favourite
value per question, and it is right whenever a user holds that value, which a seed's handful
of users may do more or less often than the uniform draw of the world's values does on
average (a third). The base and the bests are fixed policies once a run has finished (each
best was evolved on the train users only), so scoring them on more users of the same world
measures the same quantities more precisely.

For each seed's finished run under --runs-dir (`benchmarks/quickstart_seeds.py`), this builds
the same world with `--extra-users` more users (users are reproducible one by one, so the
first four are the run's), evaluates the run's base, its final best and the blind control's
final best (the `-blind` run beside it) on-policy on the new users with the run's episode
settings and LLM setup, and prints per seed, and as the mean over seeds: accuracy and memory
score on the run's held-out pair (recorded), on the new users, and on both pooled. Then what
the base answered from the model's prior: its accuracy where its read did not show the current
value, and how often the values the model picks there are the answer, for these users and
over the world's draw. The pooled memory score is the toolkit's ratio over all pooled questions
(undefined, "-", when the upper bound is not clearly above random).

Runs resume (under --out); a finished one only prints.

    .venv/bin/python benchmarks/quickstart_heldout.py [--seeds 13 14 15] [--extra-users 4]
        [--runs-dir benchmarks/records/quickstart_seeds-addable-failures]
        [--out benchmarks/records/quickstart_heldout]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from evolve import api
from evolve.core.files import atomic_write_text
from evolve.results.records import CandidateRecord, ExperimentResult
from evolve.simulator.environment import Environment
from evolve.simulator.evaluation import EvaluationReport
from evolve.simulator.metrics import MetricSummary, memory_ratio
from evolve.simulator.records import UserResult
from evolve.simulator.run_dir import RunLayout
from evolve.simulator.synthesis.catalogs import Catalog, load_catalog
from evolve.simulator.synthesis.offline import synthesize_users
from evolve.simulator.synthesis.presets import get_preset
from evolve.spec.config import ExperimentSpec, ResolvedExperiment, resolve

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "records"
sys.path.insert(0, str(ROOT / "benchmarks"))  # a sibling script, also when loaded by path
from types_list_room import read_showed_current  # noqa: E402

# The policies scored: the run's base, its best, and the blind control's best.
POLICIES = ("base", "best", "blind")
# Environment seeds over which the world's draw of a fact's value is tallied (offline, no LLM).
DRAW_SEEDS = range(300)


@dataclass(frozen=True)
class Scores:
    """Counts behind one policy's accuracy and memory score on a set of questions."""

    questions: int
    correct: float
    upper_bound_correct: float
    random_correct: float

    @classmethod
    def of(cls, summary: MetricSummary) -> Scores:
        n = summary.n_items
        if summary.upper_bound_score is None or summary.accuracy is None:
            raise SystemExit("a held-out evaluation has no accuracy or upper bound: rerun it")
        return cls(n, summary.accuracy * n, summary.upper_bound_score * n, summary.random_score * n)

    def __add__(self, other: Scores) -> Scores:
        return Scores(
            self.questions + other.questions,
            self.correct + other.correct,
            self.upper_bound_correct + other.upper_bound_correct,
            self.random_correct + other.random_correct,
        )

    @property
    def accuracy(self) -> float:
        return self.correct / self.questions

    @property
    def memory_score(self) -> float | None:
        # Every question of a recall world has the same number of options, so one random
        # share per question reproduces the run's own ratio and margin.
        random_share = self.random_correct / self.questions
        upper_bound = self.upper_bound_correct / self.questions
        return memory_ratio(self.accuracy, [random_share] * self.questions, upper_bound)


def seeded(spec: ExperimentSpec, seed: int, extra_users: int) -> ExperimentSpec:
    """The run's spec for `seed`, its world with `extra_users` more held-out users."""
    environment = spec.environment
    if not isinstance(environment.heldout_users, int) or not isinstance(environment.users, int):
        raise SystemExit("the spec must give users and heldout_users as counts")
    return spec.model_copy(
        update={
            "environment": environment.model_copy(
                update={
                    "seed": seed,
                    "users": environment.users + extra_users,
                    "heldout_users": environment.heldout_users + extra_users,
                }
            )
        }
    )


def users_not_scored(resolved: ResolvedExperiment, scored: Iterable[str]) -> Environment:
    """The held-out users of the wider world that the run's held-out evaluation (`scored`)
    did not score."""
    known = set(scored)
    return Environment(items=[item for item in resolved.heldout.items if item.id not in known])


def finished_run(run_dir: Path, seed: int, runs_dir: Path) -> ExperimentResult:
    result_file = run_dir / "result.json"
    if not result_file.is_file():
        raise SystemExit(
            f"no finished run at {run_dir}: run benchmarks/quickstart_seeds.py --seeds {seed} "
            f"--runs-dir {runs_dir} first"
        )
    return ExperimentResult.model_validate_json(result_file.read_text())


def base_and_best(result: ExperimentResult) -> tuple[CandidateRecord, CandidateRecord]:
    if result.best_id is None:
        raise SystemExit(f"{result.name}: the run has no best candidate; finish it first")
    best = result.candidate(result.best_id)
    base = result.lineage(best.id)[-1]
    if best.heldout is None or base.heldout is None:
        raise SystemExit(f"{result.name}: base or best has no held-out evaluation; finish it")
    return base, best


def recorded_heldout(run_dir: Path, record: CandidateRecord) -> list[UserResult]:
    """The users of a candidate's held-out evaluation in a finished run (one run directory per
    user under the candidate's fingerprint)."""
    root = run_dir / "evaluations" / "heldout" / record.fingerprint[:16]
    users = []
    for user_root in sorted(path for path in root.iterdir() if path.is_dir()):
        layout, periods = RunLayout(user_root), []
        while (period := layout.load_period_result(user_root.name, len(periods))) is not None:
            periods.append(period)
        users.append(UserResult(user_id=user_root.name, periods=periods))
    return users


def unshown_answers(users: Iterable[UserResult], catalog: Catalog) -> list[tuple[str, str, bool]]:
    """(fact, chosen value, right) of every answer whose read did not show the sentence that
    revealed the fact's current value: what the model answers from its prior."""
    answers = []
    for user in users:
        for period in user.periods:
            for item in period.items:
                if read_showed_current(user, period.period_index, item, catalog):
                    continue
                (fact,) = item.required_info  # a recall world asks about one fact a question
                chosen = item.chosen_state[0] if item.chosen_state else ""
                answers.append((fact, chosen, item.correct))
    return answers


def favourite_hits(
    answers: Iterable[tuple[Mapping[str, str], str]], favourites: Mapping[str, str]
) -> tuple[int, int]:
    """Of these (state, fact asked) questions, how many have the favourite value as the
    answer, and how many there are."""
    hits = total = 0
    for state, fact in answers:
        total += 1
        hits += state[fact] == favourites.get(fact)
    return hits, total


def favourite_share(users: Iterable[UserResult], favourites: dict[str, str]) -> tuple[int, int]:
    """Of these users' questions, how many have the model's favourite value as the answer."""
    return favourite_hits(
        (
            (period.state, fact)
            for user in users
            for period in user.periods
            for item in period.items
            for fact in item.required_info
        ),
        favourites,
    )


def drawn_share(
    spec: ExperimentSpec, favourites: dict[str, str], users: int, seeds: range = DRAW_SEEDS
) -> float:
    """How often the world's draw makes a favourite value the answer, over `seeds` and the
    first `users` users of each (a uniform draw gives a third)."""
    config = get_preset(spec.environment.preset)
    hits, total = favourite_hits(
        (
            (period.state, fact)
            for seed in seeds
            for item in synthesize_users(config, seed, range(users)).items
            for period in item.periods
            for qa in item.qas
            for fact in qa.required_info
        ),
        favourites,
    )
    return hits / total


def health(report: EvaluationReport) -> str:
    """The new users' conversation health, parse failures and completeness, beside their
    scores."""
    summary = report.summary
    failures = ", ".join(f"{role} {count}" for role, count in summary.parse_failures.items())
    line = f"{summary.conversation.describe()}; parse failures: {failures}"
    if summary.unreliable:
        line += f"; NOT MEANINGFUL: {summary.unreliable}"
    if not report.complete:
        line += "; INCOMPLETE: a user failed (rerun to resume)"
    return line


def _score(value: float | None) -> str:
    return "  -  " if value is None else f"{value:5.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", type=Path, default=ROOT / "experiments" / "quickstart.toml")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--extra-users", type=int, default=4)
    parser.add_argument(
        "--runs-dir", type=Path, default=RECORDS / "quickstart_seeds-addable-failures"
    )
    parser.add_argument("--out", type=Path, default=RECORDS / "quickstart_heldout")
    args = parser.parse_args()
    if args.extra_users < 1:
        parser.error(f"--extra-users must be at least 1, got {args.extra_users}")
    spec = api.load_spec(args.spec)
    own = spec.environment.seed
    seeds = args.seeds or [own, own + 1, own + 2]
    catalog = load_catalog()
    rows = []
    base_users: dict[str, list[UserResult]] = {"pair": [], "new": []}
    for seed in seeds:
        run_dir = args.runs_dir / f"{spec.name}-s{seed}"
        base, best = base_and_best(finished_run(run_dir, seed, args.runs_dir))
        _, blind = base_and_best(finished_run(Path(f"{run_dir}-blind"), seed, args.runs_dir))
        records = {"base": base, "best": best, "blind": blind}
        resolved = resolve(seeded(spec, seed, args.extra_users))
        new_users = users_not_scored(resolved, base.heldout.users)
        policies = {
            name: resolved.base_policy.with_components(record.components).with_parameters(
                **record.parameters
            )
            for name, record in records.items()
        }
        reports = api.evaluate_policies(
            new_users,
            policies,
            args.out / f"seed{seed}",
            llm=spec.llm,
            episode=resolved.episode,
        )
        base_users["pair"] += recorded_heldout(run_dir, base)
        base_users["new"] += reports["base"].users
        row: dict[str, object] = {"seed": seed, "best_id": best.id}
        for name, record in records.items():
            pair = Scores.of(record.heldout.summary)
            new = Scores.of(reports[name].summary)
            row[name] = {
                part: {
                    "questions": scores.questions,
                    "accuracy": scores.accuracy,
                    "memory_score": scores.memory_score,
                }
                for part, scores in (("pair", pair), ("new", new), ("pooled", pair + new))
            } | {"conversation": health(reports[name])}
        rows.append(row)
        print(
            f"seed {seed}: base, {best.id} and the blind control's {blind.id} on "
            f"{len(new_users.items)} more users",
            flush=True,
        )
    atomic_write_text(args.out / "summary.json", json.dumps(rows, indent=2) + "\n")

    print("\nheld-out accuracy / memory score: the run's pair, the new users, both pooled")
    print("seed  policy   pair (n)          new (n)           pooled (n)")
    for row in rows:
        for name in POLICIES:
            parts = row[name]
            print(
                f"{row['seed']:>4}  {name:<6}"
                + "".join(
                    f"  {parts[p]['accuracy']:.3f} / {_score(parts[p]['memory_score'])} "
                    f"({parts[p]['questions']:>3})"
                    for p in ("pair", "new", "pooled")
                )
            )
            print(f"              {parts['conversation']}")
    for name in POLICIES:
        means = []
        for part in ("pair", "new", "pooled"):
            scores = [row[name][part]["memory_score"] for row in rows]
            accuracy = statistics.fmean(row[name][part]["accuracy"] for row in rows)
            memory = "-" if any(s is None for s in scores) else f"{statistics.fmean(scores):.3f}"
            means.append(f"{part} {accuracy:.3f} / {memory}")
        print(f"mean  {name:<6}  " + ", ".join(means))
    prior_note(spec, base_users, catalog)


def prior_note(
    spec: ExperimentSpec, base_users: dict[str, list[UserResult]], catalog: Catalog
) -> None:
    """What the base answers from the model's prior: its accuracy where the read did not show
    the current value, and how often the model's favourite values are the answer for these
    users against the world's draw."""
    unshown = {part: unshown_answers(users, catalog) for part, users in base_users.items()}
    chosen = Counter((fact, value) for answers in unshown.values() for fact, value, _ in answers)
    favourites: dict[str, str] = {}
    for (fact, value), _ in chosen.most_common():
        favourites.setdefault(fact, value)
    print(
        "\nthe base where its read did not show the current value (the model's prior): right "
        + ", ".join(
            f"{sum(right for *_, right in answers)} of {len(answers)} ({part})"
            for part, answers in unshown.items()
        )
    )
    print(
        "its most chosen value per fact there is the answer to "
        + ", ".join(
            "{} of {} ({})".format(*favourite_share(users, favourites), part)
            for part, users in base_users.items()
        )
        + f" questions; the world's draw makes it the answer to "
        f"{drawn_share(spec, favourites, spec.environment.users):.3f} of all questions "
        f"(seeds {DRAW_SEEDS.start}-{DRAW_SEEDS.stop - 1}, "
        f"their first {spec.environment.users} users)"
    )
    print(
        f"favourites: {', '.join(f'{fact}: {value}' for fact, value in sorted(favourites.items()))}"
    )


if __name__ == "__main__":
    main()
