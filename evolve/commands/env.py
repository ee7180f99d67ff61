"""`evolve env`: synthesize, validate and inspect AMemGym environment files (data.json format).

`evolve env generate` was renamed `evolve env synthesize` (a "generation" is a step of
evolution): hidden from `--help`, the old name is a one-line error naming the new one.
"""

from __future__ import annotations

import argparse
import string
import time
from pathlib import Path

from evolve.commands.env_llm import add_llm_synthesize_arguments, run_llm_synthesize
from evolve.commands.flags import seed_value
from evolve.core.errors import ConfigError, EnvironmentDataError
from evolve.simulator.environment import (
    PROBLEMS_KEPT,
    Environment,
    EnvironmentItem,
    InconsistentEnvironmentError,
    first_problems,
    load_environment,
    save_environment,
)
from evolve.simulator.synthesis.catalogs import load_catalog
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import PRESETS, get_preset

_ANSWER_CHARS = 110


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "env",
        help="synthesize, validate and inspect AMemGym environments",
        description="Environment files use the original AMemGym data.json format, so files "
        "made by the original code (e.g. its published v1.base set) work too.",
    )
    actions = parser.add_subparsers(dest="env_action", metavar="ACTION")
    actions.required = True

    synthesize = actions.add_parser(
        "synthesize",
        help="synthesize an environment offline (seeded, no LLM) or with --llm",
        description=SYNTHESIZE_DESCRIPTION,
    )
    add_synthesize_arguments(synthesize)
    synthesize.set_defaults(handler=run_synthesize)
    # The old name: no help= keeps it out of the ACTION list. Whatever follows it, the user is
    # told the new name rather than about a flag: with no prefix characters its flags are
    # words to repeat in the message, not options to check.
    generate = actions.add_parser("generate", add_help=False, prefix_chars="\0")
    generate.add_argument("rest", nargs="*")
    generate.set_defaults(handler=run_generate)

    validate = actions.add_parser(
        "validate",
        help="check an environment file for structural and consistency problems",
        description="Print OK with counts, or the problems (naming item, period and "
        f"variable; the first {PROBLEMS_KEPT}, then how many more) and exit with status 2.",
    )
    validate.add_argument("file", type=Path)
    validate.set_defaults(handler=run_validate)

    show = actions.add_parser(
        "show",
        help="print a readable summary of an environment or of one user",
        description="Without --user: one line per user. With --user: schema, the value of "
        "every variable in every period, and the questions with their gold choices.",
    )
    show.add_argument("file", type=Path)
    show.add_argument("--user", metavar="ID", help="user id, unique id prefix, or 0-based index")
    show.set_defaults(handler=run_show)


SYNTHESIZE_DESCRIPTION = (
    "Sample users from the built-in catalog of everyday-life state variables and advice "
    "questions. The same preset, seed and user count give a byte-identical file."
)


def add_synthesize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=seed_value, default=0)
    parser.add_argument(
        "--users", type=int, default=None, help="number of users (default: 20 for v1.*, 4 for tiny)"
    )
    parser.add_argument("--out", type=Path, required=True, help="environment file to write")
    parser.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="DIR",
        help="extra catalog directory of *.json files (repeatable; see catalog/README.md)",
    )
    add_llm_synthesize_arguments(parser)  # --llm: the paper's LLM pipeline instead


def run_generate(args: argparse.Namespace) -> int:
    raise ConfigError(
        "'evolve env generate' is now called 'evolve env synthesize': run "
        f"evolve env synthesize {' '.join(args.rest)}".rstrip()
    )


def run_synthesize(args: argparse.Namespace) -> int:
    if args.out.is_dir():
        # Checked first: the write would fail late, as a storage error promising a resume.
        raise ConfigError(
            f"--out {str(args.out)!r} is a directory; expected the environment file to write, "
            f"e.g. --out {args.out / 'env.json'}"
        )
    if args.llm:
        return run_llm_synthesize(args)
    config = get_preset(args.preset)
    started = time.perf_counter()
    catalog = load_catalog(args.catalog)
    env = synthesize_environment(config, args.seed, args.users, catalog=catalog)
    save_environment(env, args.out)
    elapsed = time.perf_counter() - started
    print(
        f"wrote {args.out}: {describe_counts(env)} "
        f"(preset {config.name}, seed {args.seed}) in {elapsed:.2f}s"
    )
    print(f"content hash {env.content_hash()}")
    print(
        f"episode defaults for this preset: rounds_initial={config.rounds_initial}, "
        f"rounds_update={config.rounds_update}"
    )
    return 0


def run_validate(args: argparse.Namespace) -> int:
    try:
        env = load_environment(args.file, check=False)
        problems, total = first_problems(env.iter_problems())
    except InconsistentEnvironmentError as error:
        problems, total = error.problems, error.total
    if total:
        for problem in problems:
            print(f"  - {problem}")
        if total > len(problems):
            print(f"  ... and {total - len(problems)} more problem(s) not listed")
        print(f"INVALID: {args.file}: {total} problem(s)")
        return 2
    print(f"OK: {args.file}: {describe_counts(env)}; content hash {env.content_hash()[:16]}")
    return 0


def run_show(args: argparse.Namespace) -> int:
    env = load_environment(args.file, check=False)
    problems = env.problems()
    if args.user is None:
        print(render_overview(env))
    else:
        print(render_user(find_user(env, args.user)))
    if problems:
        print(
            f"\nwarning: {len(problems)} consistency problem(s); "
            f"run `evolve env validate {args.file}` to list them"
        )
    return 0


def describe_counts(env: Environment) -> str:
    users = len(env.items)
    periods = sorted({len(item.periods) for item in env.items})
    sessions = sum(len(p.sessions) for item in env.items for p in item.periods)
    questions = sum(len(item.qas) for item in env.items)
    choices = sum(len(qa.answer_choices) for item in env.items for qa in item.qas)
    period_text = "/".join(str(count) for count in periods) or "0"
    return (
        f"{users} users, {period_text} periods each, {sessions} sessions, "
        f"{questions} questions, {choices} answer choices"
    )


def find_user(env: Environment, key: str) -> EnvironmentItem:
    for item in env.items:
        if item.id == key:
            return item
    if key.isdigit() and int(key) < len(env.items):
        return env.items[int(key)]
    matches = [item for item in env.items if item.id.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(item.id for item in env.items[:5])
    reason = "matches several users" if matches else "matches no user"
    raise EnvironmentDataError(
        f"--user {key!r} {reason}; give a full id, a unique prefix or an index "
        f"(0-{len(env.items) - 1}); ids include: {known}"
    )


def _profile_line(item: EnvironmentItem) -> str:
    profile = item.user_profile
    if isinstance(profile, dict):
        parts = [str(profile[key]) for key in ("name", "age", "occupation") if key in profile]
        if parts:
            return ", ".join(parts)
    first_line = item.profile_text().strip().splitlines()[:1]
    return first_line[0][:60] if first_line else "(no profile)"


def render_overview(env: Environment) -> str:
    width = max([len(item.id) for item in env.items] + [4])
    lines = [
        describe_counts(env),
        "",
        f"{'id':<{width}}  periods  sessions  variables  questions  profile",
    ]
    for item in env.items:
        sessions = sum(len(p.sessions) for p in item.periods)
        lines.append(
            f"{item.id:<{width}}  {len(item.periods):>7}  {sessions:>8}  "
            f"{len(item.state_schema):>9}  {len(item.qas):>9}  {_profile_line(item)}"
        )
    return "\n".join(lines)


def _code(values: list[str], value: str | None) -> str:
    if value is None or value not in values:
        return "?"
    index = values.index(value)
    return string.ascii_lowercase[index] if len(values) <= 26 else str(index + 1)


def render_user(item: EnvironmentItem) -> str:
    schema = item.state_schema
    sessions = sum(len(p.sessions) for p in item.periods)
    lines = [
        f"User {item.id}: {_profile_line(item)}",
        f"start {item.start_time}, {len(item.periods)} periods (0 = initial), {sessions} sessions",
        "",
        "Schema (value codes):",
    ]
    width = max([len(var) for var in schema] + [8])
    for var, values in schema.items():
        codes = "  ".join(f"{_code(values, value)}={value}" for value in values)
        lines.append(f"  {var:<{width}}  {codes}")

    lines += ["", "Trajectory (value code per period; * = changed in that period):"]
    header = "".join(f"P{index:<4}" for index in range(len(item.periods)))
    lines.append(f"  {'variable':<{width}}  {header}")
    for var, values in schema.items():
        cells = []
        previous = None
        for index, period in enumerate(item.periods):
            value = period.state.get(var)
            changed = index > 0 and value != previous
            cells.append(f"{_code(values, value) + ('*' if changed else ''):<5}")
            previous = value
        lines.append(f"  {var:<{width}}  {''.join(cells)}")

    lines += ["", "Questions (gold choice number per period):"]
    for qa_index, qa in enumerate(item.qas):
        lines.append(f"  Q{qa_index} {qa.query}  [{', '.join(qa.required_info)}]")
        golds = []
        for period_index in range(len(item.periods)):
            try:
                golds.append(
                    f"P{period_index}:{item.gold_choice_index(period_index, qa_index) + 1}"
                )
            except EnvironmentDataError:
                golds.append(f"P{period_index}:-")
        lines.append(f"     gold {' '.join(golds)}")
        for choice_index, choice in enumerate(qa.answer_choices):
            answer = choice.answer
            if len(answer) > _ANSWER_CHARS:
                answer = answer[: _ANSWER_CHARS - 3] + "..."
            lines.append(
                f"     {choice_index + 1}. [{' | '.join(choice.state)}] ({choice.type}) {answer}"
            )
    return "\n".join(lines)
