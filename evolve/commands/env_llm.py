"""`evolve env synthesize --llm`: flags, progress bar and printed report for the LLM synthesis
pipeline (the library API is `evolve.simulator.synthesis`)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from evolve.commands.flags import seed_value
from evolve.commands.progress import stderr_is_terminal
from evolve.core.errors import ConfigError, LLMOutputError
from evolve.core.files import atomic_write_json
from evolve.simulator.environment import save_environment
from evolve.simulator.synthesis.catalogs import load_catalog
from evolve.simulator.synthesis.config import (
    LLMSynthesisConfig,
    load_synthesis_config,
    synthesis_config_from_dict,
)
from evolve.simulator.synthesis.personas import catalog_personas, load_nemotron_personas
from evolve.simulator.synthesis.pipeline import ProgressEvent, synthesize_environment_llm


def add_llm_synthesize_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the LLM pipeline's flags; flags the parser already has (offline synthesis's
    --seed, --out, --users, ...) are shared, not redefined."""
    from evolve.commands.llm_flags import add_llm_arguments

    existing = set(parser._option_string_actions)

    def add(flag: str, **kwargs: object) -> None:
        if flag not in existing:
            parser.add_argument(flag, **kwargs)  # type: ignore[arg-type]

    add(
        "--llm",
        action="store_true",
        help="synthesize with the paper's LLM pipeline (simulator role) instead of the catalog",
    )
    add(
        "--personas",
        type=Path,
        metavar="FILE.parquet",
        help="Nemotron-Personas parquet file (default: the built-in catalog personas)",
    )
    add(
        "--config",
        type=Path,
        metavar="FILE.toml",
        help="LLM synthesis config (see experiments/synthesize_llm.toml; default: preset tiny)",
    )
    add("--lang", help="language of generated text, e.g. en, zh (identifiers stay ASCII)")
    add("--users", type=int, default=None, help="number of users (default: the config's)")
    add("--seed", type=seed_value, default=0)
    add("--out", type=Path, help="environment file to write")
    add(
        "--work-dir",
        type=Path,
        help="where finished stages are kept for resuming (default: <out stem>.work/ beside --out)",
    )
    add("--workers", type=int, help="users synthesized concurrently (default: the config's)")
    if "--model" not in existing:
        add_llm_arguments(parser)


def config_from_args(args: argparse.Namespace) -> LLMSynthesisConfig:
    config_path = getattr(args, "config", None)
    if config_path:
        config = load_synthesis_config(config_path)
    else:
        config = synthesis_config_from_dict({"preset": getattr(args, "preset", None) or "tiny"})
    updates: dict[str, object] = {}
    if getattr(args, "lang", None):
        updates["lang"] = args.lang
    if getattr(args, "workers", None) is not None:
        updates["workers"] = args.workers
    if getattr(args, "users", None) is not None:
        updates["num_users"] = args.users
    if updates:
        config = synthesis_config_from_dict(
            {**config.model_dump(), **updates}, source="command-line flags"
        )
    return config


def run_llm_synthesize(args: argparse.Namespace) -> int:
    from evolve.commands.llm_flags import open_role_lms_from_args

    config = config_from_args(args)
    out: Path | None = getattr(args, "out", None)
    if out is None:
        raise ConfigError("--out is required: the environment file to write, e.g. --out env.json")
    out = Path(out)
    work_dir = getattr(args, "work_dir", None) or out.parent / f"{out.stem}.work"
    seed = int(getattr(args, "seed", 0) or 0)
    count = config.num_users
    if getattr(args, "personas", None):
        personas = load_nemotron_personas(args.personas, count, seed)
        source = f"personas from {args.personas}"
    else:
        personas = catalog_personas(count, seed, load_catalog(getattr(args, "catalog", None) or []))
        source = "built-in catalog personas"
    print(
        f"LLM synthesis: {count} user(s) ({source}), {config.num_periods} periods of "
        f"{config.period_length} {config.period_unit}, {config.num_questions} questions, "
        f"lang {config.lang}, seed {seed}, {config.workers} worker(s); work dir {work_dir}"
    )
    started = time.perf_counter()
    with open_role_lms_from_args(args) as lms:
        before = lms.usage.snapshot()
        # Drawn on a terminal only: a redirected log gets the plain lines below.
        drawn = stderr_is_terminal()
        bar = tqdm(total=count, unit="user", desc="users", file=sys.stderr, disable=not drawn)

        def on_progress(event: ProgressEvent) -> None:
            bar.set_postfix_str(f"{event.user_id[:16]} {event.unit} {event.status}")
            if event.status in ("included", "excluded"):
                bar.update(1)
            if event.status == "excluded":
                tqdm.write(f"excluded {event.user_id} at {event.unit}: {event.detail}")

        try:
            result = synthesize_environment_llm(
                config, lms, personas, seed=seed, work_dir=work_dir, on_progress=on_progress
            )
        finally:
            bar.close()
        run_usage = lms.usage.snapshot().minus(before)
    elapsed = time.perf_counter() - started
    report = result.report
    print("\nTokens and estimated cost per stage (including stages resumed from the work dir):")
    print(report.stage_table())
    print("\nPer user:")
    print(report.user_table())
    print("\nLLM calls made by this run (all roles):")
    print(run_usage.table())
    print(run_usage.bill())
    print(report.cost_summary())
    report_path = out.with_name(f"{out.stem}.report.json")
    atomic_write_json(report_path, report.model_dump(mode="json"), indent=1, final_newline=False)
    excluded = report.excluded
    if excluded:
        print(f"\n{len(excluded)} user(s) excluded (kept out of the environment):")
        for user in excluded:
            print(f"  - {user.user_id}: stage {user.stage} ({user.unit}): {user.reason}")
    if not result.environment.items:
        # Not a toolkit bug: the simulator model's outputs failed their checks (see the
        # excluded users above), so the exit code is the LLM's, with the fix in one line.
        raise LLMOutputError(
            f"no user passed validation: all {len(excluded)} of {count} user(s) were excluded "
            f"(stages and reasons above and in {report_path}); nothing written to {out}; raise "
            "the [retries] budget in the --config file or use a stronger --model"
        )
    save_environment(result.environment, out)
    print(
        f"wrote {out}: {len(result.environment.items)} of {count} user(s) in {elapsed:.1f}s; "
        f"report {report_path}; content hash {result.environment.content_hash()[:16]}"
    )
    return 0
