"""`evolve eval`: evaluate one or more memory policies on an AMemGym environment.

Why one module: the command's flags, its checks before the first call, the two result
tables and the spend journal are one user-facing flow; split, each part would be read alone
and misunderstood.

Each policy gets its own run directory under --out (resumed if it exists with the same
configuration, which is checked before any LLM call); the upper bound is computed once,
cached per environment and agent endpoint (see `baselines`), and shared by all policies.
Prints one row per policy, side by side; each score again with its 95% interval (and, with
several policies, each one's paired difference to the first); then why a memory score is
undefined and a warning when most answers were unparseable.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from evolve.commands import interrupt
from evolve.commands.flags import add_no_progress, add_upper_bound_flags, seed_value
from evolve.commands.llm_flags import add_llm_arguments, open_role_lms_from_args
from evolve.commands.progress import EvalBars, make_bar
from evolve.commands.protocol_start import check_embedder, print_protocol_start
from evolve.core.errors import ConfigError
from evolve.core.files import safe_name
from evolve.core.locking import run_lock
from evolve.core.paths import cache_dir
from evolve.core.protocol import EVAL_COMMAND_PROTOCOL, PROTOCOLS, ProtocolRules, rules_for
from evolve.llm import RoleLMs
from evolve.llm.usage import Usage
from evolve.optimize.experiment_dir import ExperimentDir
from evolve.reporting.intervals import format_interval_table, paired_rows
from evolve.results.budget import SpendListener
from evolve.results.objective import format_score
from evolve.simulator.baselines import compute_upper_bound
from evolve.simulator.environment import Environment, load_environment
from evolve.simulator.evaluation import (
    EpisodeConfig,
    EvaluationReport,
    check_resumable,
    probe_scope_problem,
    run_evaluation,
)
from evolve.simulator.metric_registry import View, metrics_in
from evolve.simulator.metrics import MetricSummary
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import PRESETS, get_preset
from evolve.stats import QuestionOutcomes, outcomes_from_users
from memory_policies import MemoryPolicy, build_policy

DEFAULT_OUT = Path("runs") / "eval"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="evaluate memory policies on an AMemGym environment",
        description="Run AMemGym episodes (simulated user <-> policy, questions, diagnosis) "
        "for each --policy and print accuracy, memory score, write/read/utilization failure "
        "rates, parse failures, tokens and wall time. Runs resume by default.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--env", type=Path, help="environment file (the original data.json format)")
    source.add_argument(
        "--preset", choices=sorted(PRESETS), help="synthesize the environment from a preset"
    )
    parser.add_argument(
        "--seed",
        type=seed_value,
        default=0,
        help="seed of the generated environment and the episodes",
    )
    parser.add_argument(
        "--policy",
        action="append",
        required=True,
        metavar="SPEC",
        help="policy spec, e.g. native, in_context:update_every=2, or a bundle directory "
        "(repeat to compare policies)",
    )
    parser.add_argument("--users", type=int, help="evaluate only the first N users")
    parser.add_argument(
        "--off-policy",
        type=Path,
        metavar="DIR",
        help="replay recorded transcripts (a previous run directory, or the original code's "
        "per-user output) instead of live sessions",
    )
    parser.add_argument(
        "--protocol",
        choices=PROTOCOLS,
        default=EVAL_COMMAND_PROTOCOL,
        help="information flow: 'paper' reproduces the reference AMemGym code's (default; "
        "comparable with published numbers), 'evolve' is this toolkit's (docs/protocols.md)",
    )
    parser.add_argument(
        "--probes",
        choices=("all", "wrong_only"),
        default="all",
        help="wrong_only: probe only the variables of wrongly answered items (fewer calls; "
        "--protocol evolve only)",
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=4,
        help="LLM calls in flight (users, questions and probes share them; so at most this "
        "many users at once)",
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})"
    )
    add_no_progress(parser)
    parser.add_argument(
        "--rounds-init",
        type=int,
        help="rounds per period-0 session (default: the preset's; for a file 1)",
    )
    parser.add_argument(
        "--rounds-update",
        type=int,
        help="rounds per later session (default: the preset's; for a file 2 under "
        "--protocol paper, else 1)",
    )
    parser.add_argument(
        "--no-upper-bound",
        action="store_true",
        help="skip the upper-bound baseline (no memory score)",
    )
    add_upper_bound_flags(parser, cache_dir=True)
    add_llm_arguments(parser)
    parser.set_defaults(handler=run_eval)


def build_eval_policies(specs: list[str], rules: ProtocolRules) -> list[MemoryPolicy]:
    """Under the paper protocol a spec naming no variant gets variant=paper; an explicit variant
    (``in_context:variant=evolve``) or a bundle's recorded one wins."""
    return [build_policy(spec, default_variant=rules.policy_variant) for spec in specs]


def run_dir_names(specs: list[str]) -> list[str]:
    """One distinct, file-system-safe directory name per policy spec."""
    names: list[str] = []
    for spec in specs:
        base = safe_name(Path(spec.rstrip("/")).name if "/" in spec else spec.replace(":", "-"))
        name, counter = base, 2
        while name in names:
            name, counter = f"{base}_{counter}", counter + 1
        names.append(name)
    return names


def _check_counts(args: argparse.Namespace, rules: ProtocolRules) -> None:
    """Refuse out-of-range counts in one line, before pydantic would (with a traceback) or
    before they were silently replaced (0 rounds used to become 1)."""
    problem = probe_scope_problem(rules, args.probes)
    if problem:
        raise ConfigError(
            problem.replace("probes = ", "--probes ").replace("protocol = ", "--protocol ")
        )
    for flag, value in (("--concurrency", args.concurrency), ("--users", args.users)):
        if value is not None and value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    for flag, value, meaning in (
        ("--rounds-init", args.rounds_init, "rounds per period-0 session"),
        ("--rounds-update", args.rounds_update, "rounds per later session"),
    ):
        if value is not None and value < 1:
            raise ConfigError(
                f"{flag} must be at least 1 ({meaning}), got {value}; leave it out for the "
                "preset's default"
            )


def _load_env(args: argparse.Namespace, rules: ProtocolRules) -> tuple[Environment, int, int]:
    """The environment (first --users only) and the default rounds."""
    if args.preset:
        preset = get_preset(args.preset)
        env = synthesize_environment(preset, args.seed, args.users)
        return env, preset.rounds_initial, preset.rounds_update
    env = load_environment(args.env)
    rounds_initial, rounds_update = rules.data_file_rounds
    if args.users is not None:
        if args.users > len(env.items):
            print(
                f"note: --users {args.users} but {args.env} has {len(env.items)} user(s); "
                f"evaluating all {len(env.items)}",
                file=sys.stderr,
            )
        env = Environment(items=env.items[: args.users])
    return env, rounds_initial, rounds_update


def _metric_cells(view: View, summary: MetricSummary) -> tuple[str, list[str]]:
    """The header and the cells of the declared metrics of a table, in declaration order
    ("-" where a score is undefined; the accuracy always has its own column)."""
    header, cells = [], []
    for declaration in metrics_in(view):
        width = max(6, len(declaration.column))
        header.append(f"{declaration.column:>{width}}")
        cells.append(f"{format_score(declaration.value_of(summary)):>{width}}")
    return " ".join(header), cells


def format_table(rows: list[tuple[str, EvaluationReport]]) -> str:
    width = max([6, *(len(name) for name, _ in rows)])
    metrics_header, _ = _metric_cells("eval", MetricSummary())
    header = (
        f"{'policy':<{width}} {metrics_header} {'items':>5} {'parse!':>6} {'calls':>6} "
        f"{'tokens':>8} {'wall s':>7}"
    )
    lines = [header, "-" * len(header)]
    for name, report in rows:
        s = report.summary
        _, cells = _metric_cells("eval", s)
        lines.append(
            f"{name:<{width}} {' '.join(cells)} {s.n_items:>5} {s.parse_failures_total:>6} "
            f"{s.llm_calls:>6} {s.tokens:>8} {report.wall_time_s:>7.1f}"
        )
    return "\n".join(lines)


def format_intervals(outcomes: list[tuple[str, QuestionOutcomes]]) -> list[str]:
    """Each policy's accuracy and memory score with 95% intervals and the users and questions
    they rest on; with several policies, each later one's paired difference to the first
    (the baseline) on the same questions, with McNemar's counts and the verdict."""
    heading = "scores with 95% intervals"
    baseline = outcomes[0][0] if len(outcomes) > 1 else None
    if baseline is not None:
        heading += f"; diff = policy - {baseline} (the first --policy) on the same questions"
    return [heading, *format_interval_table(paired_rows(outcomes), baseline)]


def format_original_table(rows: list[tuple[str, EvaluationReport]]) -> str:
    """The reference code's rules on the same results: random fallback for unparseable
    answers, plain-mean memory score, and its per-variable diagnosis (means per item)."""
    width = max([6, *(len(name) for name, _ in rows)])
    metrics_header, _ = _metric_cells("original", MetricSummary())
    header = f"{'policy':<{width}} {metrics_header}"
    lines = [header, "-" * len(header)]
    for name, report in rows:
        _, cells = _metric_cells("original", report.summary)
        lines.append(f"{name:<{width}} {' '.join(cells)}")
    return "\n".join(lines)


def format_notes(rows: list[tuple[str, EvaluationReport]]) -> list[str]:
    """Why a memory score is undefined, and a loud warning where the numbers mean nothing."""
    notes = []
    for name, report in rows:
        s = report.summary
        if s.memory_score is None and s.upper_bound_score is not None:
            notes.append(f"{name}: memory score undefined: {s.memory_score_undefined}")
        elif s.memory_score_period_mean is None and s.period_mean_undefined:
            notes.append(f"{name}: mean of periods undefined: {s.period_mean_undefined}")
    for name, report in rows:
        health = report.summary.conversation
        if health.user_messages or health.assistant_messages:
            notes.append(f"{name}: conversation health: {health.describe()}")
            warning = health.warning()
            if warning:
                notes.append(f"WARNING: {name}: {warning}")
    for name, report in rows:
        reason = report.summary.unreliable
        if reason:
            notes.append(
                f"WARNING: {name}: THESE NUMBERS ARE NOT MEANINGFUL: {reason}; the endpoint's "
                "replies do not parse (check --structured-output and the model with "
                "`evolve doctor`)"
            )
    return notes


@contextmanager
def journal_spend(out: Path, lms: RoleLMs) -> Iterator[ExperimentDir]:
    """Append each LLM request of this invocation to `OUT/spend.jsonl` before it is sent and
    when it ends, and each completed call with its tokens (the journal `evolve run` keeps,
    see `evolve.optimize.experiment_dir`): a killed eval leaves at worst requests of unknown
    outcome, counted as spent, and reruns add to it."""
    experiment_dir = ExperimentDir(out)
    before = experiment_dir.load_spend()
    listener = SpendListener(
        lms.usage, experiment_dir.open_journal(), wall_before=before.wall_time_s
    )
    try:
        yield experiment_dir
    finally:
        listener.close(mark_wall_time=True)


def run_eval(args: argparse.Namespace) -> int:
    # Policies and the environment are checked before any server starts or LLM call.
    rules = rules_for(args.protocol)  # the one look-up of the run's protocol
    _check_counts(args, rules)
    policies = build_eval_policies(args.policy, rules)
    env, rounds_initial, rounds_update = _load_env(args, rules)
    config = EpisodeConfig(
        rounds_initial=args.rounds_init if args.rounds_init is not None else rounds_initial,
        rounds_update=args.rounds_update if args.rounds_update is not None else rounds_update,
        concurrency=args.concurrency,
        seed=args.seed,
        rules=rules,
        probes=args.probes,
    )
    names = run_dir_names(args.policy)
    embeds = any(policy.uses_embedder for policy in policies)
    check_embedder(args.protocol, [embeds])
    rows: list[tuple[str, EvaluationReport]] = []
    outcomes: list[tuple[str, QuestionOutcomes]] = []
    with (
        run_lock(args.out, "eval"),
        open_role_lms_from_args(args, rules=config.rules) as lms,
        journal_spend(args.out, lms) as experiment_dir,
    ):
        # A rerun with another environment or model is refused here, before any LLM call.
        for name, policy in zip(names, policies, strict=True):
            check_resumable(
                env, policy, lms, args.out / name, config, off_policy_dir=args.off_policy
            )
        # After the resume check (a refusal stays one line), before the first LLM call.
        print_protocol_start(args.protocol, lms, ("simulator", "agent"), embeds=embeds)
        upper_bound = None
        if not args.no_upper_bound:
            started = time.perf_counter()
            total = sum(len(qa.answer_choices) for item in env.items for qa in item.qas)
            with make_bar(
                not args.no_progress, total=total, desc="upper bound", leave=False
            ) as bar:
                upper_bound = compute_upper_bound(
                    env,
                    lms,
                    args.upper_bound_cache or cache_dir() / "upper_bound",
                    concurrency=config.concurrency,
                    on_entry=lambda entry: bar.update(1),
                    refresh=args.refresh_upper_bound,
                    rules=config.rules,
                )
            print(
                f"upper bound: {len(upper_bound.entries)} answers for {upper_bound.agent_model} "
                f"({upper_bound.parse_failures} unparseable, {time.perf_counter() - started:.1f}s)"
                + (
                    "; unparseable answers are not cached: a rerun asks them again"
                    if upper_bound.parse_failures
                    else ""
                )
            )
        for spec, name, policy in zip(args.policy, names, policies, strict=True):
            progress = EvalBars(name, enabled=not args.no_progress)
            try:
                report = run_evaluation(
                    env,
                    policy,
                    lms,
                    args.out / name,
                    config,
                    off_policy_dir=args.off_policy,
                    progress=progress,
                    upper_bound=upper_bound,
                    stop=interrupt.STOP,
                )
            finally:
                progress.close()
            print(f"{spec}: {report.run_dir}")
            rows.append((name, report))
            # The per-question records the summary was computed from, scored the same way.
            outcomes.append((name, outcomes_from_users(report.users, upper_bound=upper_bound)))
        usage = lms.usage.snapshot()
    spend: Usage = experiment_dir.load_spend()
    print(f"\nLLM usage of this invocation (cached responses cost nothing):\n{usage.table()}")
    print(usage.bill())
    print(
        f"spend of every invocation into {args.out} ({experiment_dir.journal_file.name}): "
        f"{spend.requests} LLM calls, {spend.tokens} tokens, {spend.wall_time_s:.1f}s"
    )
    print()
    print(format_table(rows))
    failures = {
        kind: sum(r.summary.parse_failures[kind] for _, r in rows)
        for kind in rows[0][1].summary.parse_failures
    }
    print(
        "parse! = unparseable outputs (counted as wrong, never replaced): "
        + ", ".join(f"{kind} {count}" for kind, count in failures.items())
    )
    print(
        "memory = the memory score (S - S_rand) / (S_UB - S_rand) over all items; mem/period = "
        "the mean of per-user-period memory scores; '-' = undefined: the upper bound is not "
        "clearly above random (by 2 questions and 2 standard errors); evolve run and evolve "
        "tune optimize memory"
    )
    print("write / read / util = our partition of the wrong answers (failure_partition.json)")
    print()
    for line in format_intervals(outcomes):
        print(line)
    print(
        "\nthe original's rules on the same answers (diagnosis_*.json in original/): acc+rf = "
        "accuracy with a random choice for unparseable answers (expected), paper-mem = the "
        "paper's mean of per-user-period memory scores, under the same '-' rule, write/read "
        "per item = "
        "variables recalled wrongly (wrong at the last update too / right then), mem success "
        "= share of items with neither ('-' under --probes wrong_only)"
    )
    print(format_original_table(rows))
    for note in format_notes(rows):
        print(note)
    return 0
