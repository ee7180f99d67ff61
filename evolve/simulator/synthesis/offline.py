"""Offline AMemGym environment synthesis: seeded sampling over a built-in catalog, no LLM.

One seeded sampling procedure whose steps share private helpers and the RNG order (moving
a draw changes every file); the catalog format is in `catalogs.py`, the config and its
presets in `presets.py`.

It follows the original generator's structure and constraints (questions first, the schema
is exactly the variables they require, an initial state exposed in period 0, then periods of
state changes each revealed by one session per change event, answer choices made of the
state variants seen on the trajectory padded with unseen random ones) but draws every text
from the catalog (`evolve/simulator/synthesis/catalog/`, format in its README.md) instead of an LLM.
It is the embedded default and the basis of the tests: the same config and seed always give
a byte-identical file, and every user is generated from its own seed derived from
(seed, user index), so one user can be reproduced on its own.
"""

from __future__ import annotations

import calendar
import itertools
import random
from collections.abc import Mapping, Sequence
from datetime import date, timedelta

from evolve.core.errors import ConfigError, shown_value
from evolve.core.seeds import derive_rng
from evolve.simulator.environment import (
    CHOICE_EXPERIENCED,
    CHOICE_RANDOM,
    QA,
    AnswerChoice,
    Environment,
    EnvironmentItem,
    Period,
    Session,
    StateUpdate,
)
from evolve.simulator.synthesis.catalogs import Catalog, CatalogQuestion, load_catalog
from evolve.simulator.synthesis.presets import MAX_USERS, OfflineSynthesisConfig
from evolve.simulator.synthesis.recall import (
    balanced_order,
    recall_domains,
    recall_question,
    sample_recall_variables,
)

DATE_FORMAT = "%Y-%m-%d"
SESSION_TIME_FORMAT = "%Y-%m-%d %H:%M:%S"

# Sessions happen in the evening, as in the original (19:00-22:00).
_EVENING_SECONDS = (19 * 3600, 22 * 3600 - 1)
# Resampling budget when a draw cannot satisfy the change constraints (rare; see _trajectory).
_MAX_ATTEMPTS = 200

_INITIAL_OPENERS = ("", "", "Hi!", "Hello!")
_UPDATE_OPENERS = ("", "", "Quick update on my side.", "A few things have changed lately.")


# --- synthesis ----------------------------------------------------------------------------


def synthesize_environment(
    config: OfflineSynthesisConfig,
    seed: int,
    num_users: int | None = None,
    *,
    catalog: Catalog | None = None,
) -> Environment:
    """`num_users` users (default `config.num_users`), each reproducible from (seed, index)."""
    catalog = catalog or load_catalog()
    count = config.num_users if num_users is None else num_users
    if count < 1:
        raise ConfigError(f"num_users must be at least 1, got {count}")
    if count > MAX_USERS:
        raise ConfigError(
            f"{shown_value(count)} users requested; at most {MAX_USERS} are synthesized at once "
            "(a larger number is usually a typo); ask for fewer users"
        )
    return synthesize_users(config, seed, range(count), catalog=catalog)


def synthesize_users(
    config: OfflineSynthesisConfig,
    seed: int,
    indices: Sequence[int],
    *,
    catalog: Catalog | None = None,
) -> Environment:
    """Only the users at `indices` of the environment generated with `seed` (each user is
    independent of the others, so they equal those of a full synthesis)."""
    catalog = catalog or load_catalog()
    items = [synthesize_user(config, seed, index, catalog=catalog) for index in indices]
    env = Environment(items=items)
    problems = env.problems()
    if problems:  # a synthesis bug, never a user error
        raise AssertionError(f"generated environment is inconsistent: {problems[:3]}")
    return env


def synthesize_user(
    config: OfflineSynthesisConfig, seed: int, index: int, *, catalog: Catalog | None = None
) -> EnvironmentItem:
    """User `index` of the environment generated with `seed` (independent of other users)."""
    catalog = catalog or load_catalog()
    _check_catalog_fits(config, catalog)
    # Personas follow one seeded permutation so that the first len(personas) users differ.
    order = list(catalog.personas)
    derive_rng("personas", seed).shuffle(order)
    persona = order[index % len(order)]
    user_id = f"u{index:03d}-{persona.id}"
    rng = derive_rng("user", seed, index)

    sample = _sample_recall if config.question_kind == "recall" else _sample_questions
    for _ in range(_MAX_ATTEMPTS):
        questions, schema = sample(rng, config, catalog)
        if not _feasible(config, questions, schema):
            continue
        trajectory = _sample_trajectory(rng, config, schema)
        if trajectory is not None:
            break
    else:
        raise ConfigError(
            f"could not sample a trajectory for {config.name!r} in {_MAX_ATTEMPTS} attempts: "
            f"{config.num_periods} periods of {list(config.changes_per_period)} changes need "
            "more variables or a higher max_changes_per_state"
        )
    states, changes = trajectory

    periods = [_initial_period(rng, config, catalog, schema, states[0])]
    counts = dict.fromkeys(schema, 0)
    for period_index in range(1, config.num_periods + 1):
        for var in changes[period_index]:
            counts[var] += 1
        periods.append(
            _update_period(
                rng,
                config,
                catalog,
                period_index,
                states[period_index - 1],
                states[period_index],
                changes[period_index],
                counts,
            )
        )
    # Recall questions spread their gold options over positions across the user's questions.
    positions: list[int] | None = [] if config.question_kind == "recall" else None
    qas = [
        _question(rng, config, question, variables, schema, states, positions)
        for question, variables in questions
    ]
    return EnvironmentItem(
        id=user_id,
        start_time=config.start_date.strftime(DATE_FORMAT),
        user_profile=persona.user_profile(user_id),
        state_schema=schema,
        periods=periods,
        qas=qas,
    )


def _check_catalog_fits(config: OfflineSynthesisConfig, catalog: Catalog) -> None:
    if config.question_kind == "recall":
        by_domain = recall_domains(catalog)
        unknown = sorted(set(config.domains or ()) - set(by_domain))
        if unknown:
            raise ConfigError(
                f"{config.name!r} draws from domains {unknown}, which have no variable with a "
                f"recall question in the catalog; its domains with recall questions: "
                f"{', '.join(sorted(by_domain))}"
            )
        domains = by_domain if config.domains is None else config.domains
        recallable = sum(len(by_domain[domain]) for domain in domains)
        if recallable < config.num_questions:
            raise ConfigError(
                f"{config.name!r} needs {config.num_questions} variables with a recall "
                f"question, its domains have {recallable}; lower num_questions or add 'recall' "
                "to more catalog variables"
            )
        return
    eligible = [q for q in catalog.questions if len(q.variables) >= config.states_per_question]
    if len(eligible) < config.num_questions:
        raise ConfigError(
            f"{config.name!r} needs {config.num_questions} questions with at least "
            f"{config.states_per_question} variables each, the catalog has {len(eligible)}; "
            "lower num_questions/states_per_question or add questions to the catalog"
        )


def _sample_questions(
    rng: random.Random, config: OfflineSynthesisConfig, catalog: Catalog
) -> tuple[list[tuple[CatalogQuestion, list[str]]], dict[str, list[str]]]:
    """Questions with their required variables, and the schema (exactly those variables)."""
    k = config.states_per_question
    eligible = [q for q in catalog.questions if len(q.variables) >= k]
    questions = []
    for question in rng.sample(eligible, config.num_questions):
        picked = set(rng.sample(question.variables, k))
        questions.append((question, [var for var in question.variables if var in picked]))
    return questions, _sample_schema(rng, config, catalog, questions)


def _sample_recall(
    rng: random.Random, config: OfflineSynthesisConfig, catalog: Catalog
) -> tuple[list[tuple[CatalogQuestion, list[str]]], dict[str, list[str]]]:
    """One recall question per variable, the variables drawn across domains."""
    variables = sample_recall_variables(rng, catalog, config.num_questions, config.domains)
    questions = [(recall_question(catalog, var), [var]) for var in variables]
    return questions, _sample_schema(rng, config, catalog, questions)


def _sample_schema(
    rng: random.Random,
    config: OfflineSynthesisConfig,
    catalog: Catalog,
    questions: list[tuple[CatalogQuestion, list[str]]],
) -> dict[str, list[str]]:
    """Each required variable's values: a random subset of the catalog's, in catalog order."""
    schema: dict[str, list[str]] = {}
    low, high = config.choices_per_state
    for _, variables in questions:
        for var in variables:
            if var in schema:
                continue
            values = list(catalog.variables[var].values)
            picked = set(rng.sample(values, min(rng.randint(low, high), len(values))))
            schema[var] = [value for value in values if value in picked]
    return schema


def _feasible(
    config: OfflineSynthesisConfig,
    questions: list[tuple[CatalogQuestion, list[str]]],
    schema: dict[str, list[str]],
) -> bool:
    capacity = len(schema) * config.max_changes_per_state
    if capacity < config.num_periods * config.changes_per_period[0]:
        return False
    for _, variables in questions:
        combinations = 1
        for var in variables:
            combinations *= len(schema[var])
        if combinations < config.min_state_variants:
            return False
    return True


def _sample_trajectory(
    rng: random.Random, config: OfflineSynthesisConfig, schema: dict[str, list[str]]
) -> tuple[list[dict[str, str]], list[list[str]]] | None:
    """States per period and the variables changed in each; None when the draw got stuck.

    Variables are drawn with weights equal to their remaining change budget, so budgets
    drain evenly and later periods still find enough variables to change.
    """
    low, high = config.changes_per_period
    states = [{var: rng.choice(values) for var, values in schema.items()}]
    changes: list[list[str]] = [[]]
    remaining = dict.fromkeys(schema, config.max_changes_per_state)
    for period_index in range(1, config.num_periods + 1):
        periods_after = config.num_periods - period_index
        available = [var for var in schema if remaining[var] > 0]
        most = min(high, len(available), sum(remaining.values()) - periods_after * low)
        if most < low:
            return None
        pool, weights, chosen = list(available), [remaining[v] for v in available], set()
        for _ in range(rng.randint(low, most)):
            pick = rng.choices(range(len(pool)), weights=weights)[0]
            chosen.add(pool.pop(pick))
            weights.pop(pick)
        state = dict(states[-1])
        changed = [var for var in schema if var in chosen]
        for var in changed:
            state[var] = rng.choice([value for value in schema[var] if value != state[var]])
            remaining[var] -= 1
        states.append(state)
        changes.append(changed)
    return states, changes


def _groups(rng: random.Random, items: Sequence[str], span: tuple[int, int]) -> list[list[str]]:
    pending = list(items)
    rng.shuffle(pending)
    groups = []
    while pending:
        size = rng.randint(*span)
        groups.append(pending[:size])
        pending = pending[size:]
    return groups


def _advance(config: OfflineSynthesisConfig, periods: int) -> date:
    """The start date moved by `periods` period lengths (months clamp to the month's end)."""
    start = config.start_date
    if config.period_unit == "days":
        return start + timedelta(days=periods * config.period_length)
    month_index = start.month - 1 + periods * config.period_length
    year, month = start.year + month_index // 12, month_index % 12 + 1
    return date(year, month, min(start.day, calendar.monthrange(year, month)[1]))


def _session_times(rng: random.Random, last_day: date, count: int) -> list[str]:
    """One evening time on each of the last `count` days up to and including `last_day`."""
    days = sorted(last_day - timedelta(days=offset) for offset in range(count))
    times = []
    for day in days:
        seconds = rng.randint(*_EVENING_SECONDS)
        hours, rest = divmod(seconds, 3600)
        stamp = f"{day.strftime(DATE_FORMAT)} {hours:02d}:{rest // 60:02d}:{rest % 60:02d}"
        times.append(stamp)
    return times


def _query(
    rng: random.Random, catalog: Catalog, exposed: Mapping[str, str], openers: Sequence[str]
) -> str:
    """An opening message revealing only the exposed values, ending with a request for help."""
    parts = [rng.choice(openers)]
    parts += [rng.choice(catalog.variables[var].values[value]) for var, value in exposed.items()]
    parts.append(rng.choice(catalog.variables[rng.choice(list(exposed))].requests))
    return " ".join(part for part in parts if part)


def _initial_period(
    rng: random.Random,
    config: OfflineSynthesisConfig,
    catalog: Catalog,
    schema: dict[str, list[str]],
    state: dict[str, str],
) -> Period:
    groups = [
        [var for var in schema if var in group]
        for group in _groups(rng, list(schema), config.variables_per_initial_session)
    ]
    times = _session_times(rng, config.start_date, len(groups))
    sessions = []
    for group, time in zip(groups, times, strict=True):
        exposed = {var: state[var] for var in group}
        sessions.append(
            Session(
                event=None,
                exposed_states=exposed,
                query=_query(rng, catalog, exposed, _INITIAL_OPENERS),
                session_time=time,
            )
        )
    return Period(
        period_start=None,
        period_end=config.start_date.strftime(DATE_FORMAT),
        period_summary=None,
        sessions=sessions,
        state=dict(state),
        updates={var: StateUpdate(old=None, new=state[var]) for var in schema},
        update_cnts=dict.fromkeys(schema, 0),
    )


def _change_text(catalog: Catalog, var: str, old: str, new: str) -> str:
    return f"{catalog.variables[var].label} changed from {old} to {new}"


def _update_period(
    rng: random.Random,
    config: OfflineSynthesisConfig,
    catalog: Catalog,
    period_index: int,
    before: dict[str, str],
    after: dict[str, str],
    changed: list[str],
    counts: dict[str, int],
) -> Period:
    start, end = _advance(config, period_index - 1), _advance(config, period_index)
    groups = [
        [var for var in changed if var in group]
        for group in _groups(rng, changed, config.changes_per_event)
    ]
    times = _session_times(rng, end, len(groups))
    sessions = []
    for group, time in zip(groups, times, strict=True):
        exposed = {var: after[var] for var in group}
        event = " and ".join(_change_text(catalog, var, before[var], after[var]) for var in group)
        sessions.append(
            Session(
                event=event[:1].upper() + event[1:],
                exposed_states=exposed,
                query=_query(rng, catalog, exposed, _UPDATE_OPENERS),
                session_time=time,
            )
        )
    summary = "; ".join(_change_text(catalog, var, before[var], after[var]) for var in changed)
    return Period(
        period_start=start.strftime(DATE_FORMAT),
        period_end=end.strftime(DATE_FORMAT),
        period_summary=f"Between {start:%Y-%m-%d} and {end:%Y-%m-%d}: {summary}.",
        sessions=sessions,
        state=dict(after),
        updates={var: StateUpdate(old=before[var], new=after[var]) for var in changed},
        # Cumulative counts up to this period (the original repeats the final totals).
        update_cnts=dict(counts),
    )


def _question(
    rng: random.Random,
    config: OfflineSynthesisConfig,
    question: CatalogQuestion,
    variables: list[str],
    schema: dict[str, list[str]],
    states: list[dict[str, str]],
    positions: list[int] | None = None,
) -> QA:
    """Choices: every variant seen on the trajectory, padded with unseen ones, shuffled (or,
    given `positions`, ordered to spread the gold options; see `recall.balanced_order`)."""
    seen = list(dict.fromkeys(tuple(state[var] for var in variables) for state in states))
    variants = list(seen)
    if len(variants) < config.min_state_variants:
        unseen = [
            combination
            for combination in itertools.product(*(schema[var] for var in variables))
            if combination not in seen
        ]
        variants += rng.sample(unseen, config.min_state_variants - len(variants))
    if positions is None:
        rng.shuffle(variants)
    else:
        gold = [tuple(state[var] for var in variables) for state in states]
        variants = balanced_order(rng, variants, gold, positions)
    choices = [
        AnswerChoice(
            state=list(variant),
            answer=question.answer(dict(zip(variables, variant, strict=True))),
            type=CHOICE_EXPERIENCED if variant in seen else CHOICE_RANDOM,
        )
        for variant in variants
    ]
    return QA(query=question.query, required_info=list(variables), answer_choices=choices)
