"""Cross-check: the reference AMemGym code and `evolve eval --protocol paper` on the same data.

Why one long file: a standalone script run against a checkout of the reference code; its
steps (export, the reference's configs and runs, ours, reading the outputs back, the table)
share arguments and paths and are used nowhere else.

Exports one environment (`evolve env synthesize`, default the tiny preset, 2 users), runs the
reference code (a checkout of AGI-Eval-Official/amemgym with its own Python; never part of this
repository) and this toolkit against the same OpenAI-compatible endpoint, native and AWI, AWE
and RAG, and prints both implementations' accuracy, memory score and original-style diagnosis
side by side. Both sides are scored by this toolkit's metric code (`evolve.simulator.
original_format` reads the reference's per-item files), so a difference in a row is a
difference in what the two implementations did, not in arithmetic.

    .venv/bin/python benchmarks/cross_check.py --reference /path/to/amemgym \\
        --reference-python /path/to/venv/bin/python [--base-url URL --model NAME | --stub] \\
        [--users 2] [--preset tiny] [--seed 0] [--agents native,awi,awe,rag] \\
        [--evolution question_only complete] [--embeddings-base-url URL] [--out DIR] [--table-only]

Without --base-url the embedded llama.cpp server with the bundled model is started (and stopped
at the end); --stub starts `stub_openai_server.py --scripted` instead, which answers every role
of both implementations validly (scripted, not a model: the numbers test the plumbing and the
branches, not memory) and logs every request to OUT/requests.jsonl, tagged with the step that
sent it (`reference native overall`, `ours awe`, ...).

After the table: ours minus the reference's accuracy per agent with a 2-SE band, and the same
on the user-periods both sides finished (like for like when the reference crashed mid-run).

--table-only makes no LLM call: it prints the table of the outputs already in --out, e.g.
after agents were run in separate invocations into the same --out (pass their --model).

AWE and RAG (the reference's mem0 agent, with and without its LLM write) need `mem0ai` (0.1.x,
whose v1.1 pipeline the reference's configs name) and `milvus-lite` in the reference's Python,
and an OpenAI-compatible `/v1/embeddings` endpoint (--embeddings-base-url; default the chat
endpoint, which the scripted stub serves). Our `external` and `raw_rag` policies embed through
the same endpoint and model (`MEMORY_POLICIES_EMBEDDER=openai:<--embedding-model>`), so both
sides retrieve alike. --evolution runs the reference's per-user evolution chain of AWI with
each feedback given (reference side only; `evolve run experiments/paper_table3_*.toml` is ours).

The reference runs with its v1.base settings (rounds 1 then 2, agent temperature 0, simulator
temperature 0.2) except `max_tokens` (--max-tokens), which keeps small models affordable. Its
outputs hold the endpoint in `agent_config.json`: keep --out outside the repository."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from evolve.core.files import safe_name
from evolve.llm.config import EmbeddedModelConfig
from evolve.llm.server import EmbeddedServer
from evolve.simulator.environment import Environment, load_environment, save_environment
from evolve.simulator.metrics import MetricSummary, summarize
from evolve.simulator.original_format import (
    parse_diagnosis_results,
    parse_overall_results,
    period_results_from_original,
)
from evolve.simulator.records import PeriodResult, UserResult
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import PRESETS, get_preset
from evolve.stats import PairingError, compare, outcomes_from_users

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # the stub's launcher, also when this file is loaded by path

from stub_openai_server import StubServer  # noqa: E402

# The reference agent kinds compared, with the reference's agent type.
AGENTS = {"native": "native", "awi": "awi", "awe": "awe", "rag": "rag"}
# The reference's evolution configs (configs/agent/awi-evolve/*.json): feedback -> its kinds.
EVOLUTION_FEEDBACK = {
    "question_only": ["vanilla_question_only"],
    "complete": ["vanilla"],
    "none": [],
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", type=Path, required=True, help="amemgym checkout")
    parser.add_argument(
        "--reference-python", type=Path, required=True, help="python with its dependencies"
    )
    endpoint = parser.add_mutually_exclusive_group()
    endpoint.add_argument("--base-url", help="OpenAI-compatible endpoint ending in /v1")
    endpoint.add_argument("--stub", action="store_true", help="start the stub server")
    parser.add_argument("--model", help="model name at --base-url (default: the served one)")
    parser.add_argument("--env", type=Path, help="environment file (default: synthesize one)")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument(
        "--agents", default="native,awi,awe,rag", help="subset of native,awi,awe,rag"
    )
    parser.add_argument(
        "--native-policy", default="native", help="our policy spec compared with native"
    )
    parser.add_argument(
        "--awi-policy", default="in_context", help="our policy spec compared with AWI"
    )
    parser.add_argument(
        "--awe-policy", default="external", help="our policy spec compared with AWE"
    )
    parser.add_argument("--rag-policy", default="raw_rag", help="our policy spec compared with RAG")
    parser.add_argument(
        "--embeddings-base-url", help="OpenAI-compatible /v1 with embeddings (default: chat's)"
    )
    parser.add_argument(
        "--embedding-model", default="text-embedding-3-small", help="embedding model (AWE)"
    )
    parser.add_argument(
        "--evolution",
        nargs="+",
        choices=sorted(EVOLUTION_FEEDBACK),
        default=[],
        help="also run the reference's per-user AWI evolution chain with each feedback given",
    )
    parser.add_argument(
        "--max-tokens", type=int, default=256, help="completion limit of both implementations"
    )
    parser.add_argument(
        "--ctx-per-slot", type=int, default=16384, help="embedded server context per slot"
    )
    parser.add_argument(
        "--rounds-init", type=int, default=1, help="rounds per period-0 session (v1.base: 1)"
    )
    parser.add_argument(
        "--rounds-update", type=int, default=2, help="rounds per later session (v1.base: 2)"
    )
    parser.add_argument("--no-upper-bound", action="store_true", help="skip both upper bounds")
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="run the reference, then ours (default against a real endpoint: both at once)",
    )
    parser.add_argument(
        "--table-only",
        action="store_true",
        help="no LLM calls: print the table of the outputs already in --out (e.g. agents run "
        "in separate invocations; pass the --model those runs used)",
    )
    parser.add_argument("--out", type=Path, default=Path("runs") / "cross_check")
    args = parser.parse_args(argv)
    unknown = set(args.agents.split(",")) - set(AGENTS)
    if unknown:
        parser.error(
            f"--agents: unknown {sorted(unknown)}; expected a subset of {','.join(AGENTS)}"
        )
    if args.users < 2 and args.env is None:
        parser.error(f"--users must be at least 2 (got {args.users}): one user proves little")
    return args


# ----- endpoint --------------------------------------------------------------------------------


@contextlib.contextmanager
def endpoint(args: argparse.Namespace, env_file: Path) -> Iterator[tuple[str, str]]:
    """(base_url, model) of the endpoint both implementations use (the scripted stub reads
    `env_file` so that its upper bound answers as a model told the state would)."""
    if args.base_url:
        yield args.base_url, args.model or "local"
        return
    if args.stub:
        log = args.out / "requests.jsonl"
        with StubServer(latency=0.01, scripted=True, log=log, environment=env_file) as stub:
            yield stub.base_url, args.model or "stub"
        return
    # The paper's native agent sends the whole history: 4k tokens per slot were too few.
    with EmbeddedServer(EmbeddedModelConfig(ctx_per_slot=args.ctx_per_slot)) as server:
        yield server.base_url, server.model_name


# ----- the reference code ------------------------------------------------------------------------


def reference_configs(
    config_dir: Path,
    model: str,
    max_tokens: int,
    embedding_model: str = "text-embedding-3-small",
    embeddings_base_url: str | None = None,
    evolution: Sequence[str] = (),
    rounds: tuple[int, int] = (1, 2),
) -> dict[str, Path]:
    """Its env config (v1.base settings; `rounds`: its initial and update session rounds),
    one agent config per compared agent (AWE as its configs/agent/awe-2-4-30.json) and one AWI
    evolution config per feedback in `evolution`
    (key `evolution <feedback>`)."""
    config_dir.mkdir(parents=True, exist_ok=True)

    def llm(temperature: float, source: str) -> dict[str, Any]:
        return {
            "llm_model": model,
            "temperature": temperature,
            "max_tokens": max_tokens,
            "source": source,
        }

    env_config = {
        "num_rounds_init": rounds[0],
        "num_rounds_update": rounds[1],
        "llm_config_low_temp": llm(0.2, "env:interaction"),
        "llm_config_high_temp": llm(1.0, "env:interaction"),
    }
    paths = {"env": config_dir / "env.json"}
    paths["env"].write_text(json.dumps(env_config, indent=2))
    for name, kind in AGENTS.items():
        agent = {"type": kind, "name": name, "llm_config": llm(0.0, "agent:interaction")}
        agent["llm_config"] |= {"base_url": None, "api_key": None}
        if kind == "awi":
            agent["agent_config"] = {"update_bsz": 2, "local_length": 4}
        if kind in ("awe", "rag"):  # the reference's awe-2-4-30 / rag-2-4-30 configs
            agent["agent_config"] = {
                "update_bsz": 2,
                "top_k": 30,
                "local_length": 4,
                "enable_llm_mem_policy": kind == "awe",
            }
            agent["memory_config"] = {
                "vector_store": {
                    "provider": "milvus",
                    "config": {"url": None, "collection_name": "mem_eval"},
                },
                "llm": {
                    "provider": "openai",
                    "config": {"openai_base_url": None, "api_key": None, "model": model},
                },
                "embedder": {
                    "provider": "openai",
                    "config": {
                        "openai_base_url": embeddings_base_url,
                        "api_key": None,
                        "model": embedding_model,
                    },
                },
                "history_db_path": None,
                "version": "v1.1",
            }
        paths[name] = config_dir / f"{name}.json"
        paths[name].write_text(json.dumps(agent, indent=2))
    for feedback in evolution:
        evolve_config = {
            "type": "awi-evolve",
            "name": f"evolution-{feedback}",
            "llm_config": llm(0.0, "agent:interaction") | {"base_url": None, "api_key": None},
            "agent_config": {"update_bsz": 2, "local_length": 4},
            "evolution_config": {
                "cadence": "no_evolution" if feedback == "none" else "period",
                "feedback_types": EVOLUTION_FEEDBACK[feedback],
                "targets": ["memory_update_prompt"],
                "init_prompt_type": "info_type",
            },
        }
        paths[f"evolution {feedback}"] = config_dir / f"evolution-{feedback}.json"
        paths[f"evolution {feedback}"].write_text(json.dumps(evolve_config, indent=2))
    return paths


def run_reference(
    args: argparse.Namespace, base_url: str, model: str, env_file: Path, agents: list[str]
) -> dict[str, str]:
    """Runs the reference modules; returns {step: failure} for the steps that failed."""
    out = args.out / "reference"
    configs = reference_configs(
        args.out / "reference-configs",
        model,
        args.max_tokens,
        args.embedding_model,
        args.embeddings_base_url,
        args.evolution,
        (args.rounds_init, args.rounds_update),
    )
    environ = os.environ | {
        "OPENAI_BASE_URL": base_url,
        "OPENAI_API_KEY": os.environ.get("OPENAI_API_KEY", "local-no-key"),
        "PYTHONPATH": str(args.reference.resolve() / "src"),
        "MEM0_TELEMETRY": "False",  # mem0 would report usage over the network
    }
    steps: list[tuple[str, list[str]]] = []
    for name in agents:
        common = ["--agent_config", str(configs[name]), "--env_data", str(env_file)]
        steps.append((f"{name} overall", ["amemgym.eval.overall", *common]))
        steps[-1][1].extend(["--env_config", str(configs["env"]), "--output_dir", str(out)])
        steps.append(
            (f"{name} diagnosis", ["amemgym.eval.diagnosis", *common, "--output_dir", str(out)])
        )
    steps.append(
        (
            "random",
            [
                "amemgym.eval.random",
                "--env_data",
                str(env_file),
                "--output_file",
                str(out / "random_metrics.json"),
            ],
        )
    )
    for feedback in args.evolution:
        steps.append(
            (
                f"evolution {feedback}",
                ["amemgym.eval.evolution", "--agent_config", str(configs[f"evolution {feedback}"]),
                 "--env_config", str(configs["env"]), "--env_data", str(env_file),
                 "--output_dir", str(out / "evolution")],
            )
        )  # fmt: skip
    if not args.no_upper_bound:
        steps.append(
            (
                "upper bound",
                ["amemgym.eval.upperbound", "--agent_config", str(configs["native"]),
                 "--env_data", str(env_file), "--output_dir", str(out / "upperbound")],
            )
        )  # fmt: skip
    failures: dict[str, str] = {}
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    for label, module_args in steps:
        tag_requests(base_url, f"reference {label}")
        started = time.perf_counter()
        log = log_dir / f"reference-{label.replace(' ', '-')}.log"
        with open(log, "w") as handle:
            code = subprocess.call(
                [str(args.reference_python), "-m", *module_args],
                cwd=args.reference,
                env=environ,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        took = time.perf_counter() - started
        print(f"reference {label}: exit {code} ({took:.0f}s, log {log})", file=sys.stderr)
        if code < 0:  # killed by a signal: the user (or the system) stopped the run
            raise SystemExit(f"reference {label} was killed (signal {-code}); stopping")
        if code != 0:
            failures[label] = f"exit {code}: {last_line(log)}"
    return failures


def tag_requests(base_url: str, tag: str) -> None:
    """Labels the requests that follow in the scripted stub's log (other endpoints: no-op)."""
    request = urllib.request.Request(
        f"{base_url}/log/tag",
        data=json.dumps({"tag": tag}).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=5):
            pass
    except OSError:
        pass  # a real endpoint has no such route


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1][:160] if lines else "(no output)"


def reference_results(
    out: Path, env: Environment, agent: str, model: str
) -> tuple[dict[str, UserResult], dict[str, str]]:
    """The reference's per-item files of one agent as our records, per user; a user the
    reference did not finish is left out, with the reason (it crashes on some model outputs,
    e.g. an unterminated JSON memory update of AWI, and then stops writing)."""
    ub_file = out / "upperbound" / model / "utilization_metrics.json"
    ub = json.loads(ub_file.read_text())["accuracy"] if ub_file.exists() else None
    users: dict[str, UserResult] = {}
    notes: dict[str, str] = {}
    for index, item in enumerate(env.items):
        user_dir = out / agent / item.id
        overall_file = user_dir / "overall_results.json"
        if not overall_file.exists():
            notes[item.id] = f"no {overall_file.name}"
            continue
        raw = json.loads(overall_file.read_text())
        unfinished = [period for period, row in enumerate(raw) if any(e is None for e in row)]
        if unfinished:
            notes[item.id] = f"the reference stopped in period {unfinished[0]}"
            continue
        overall = parse_overall_results(raw)
        diagnosis_file = user_dir / "diagnosis_results.json"
        diagnosis = (
            parse_diagnosis_results(json.loads(diagnosis_file.read_text()))
            if diagnosis_file.exists()
            else None
        )
        if diagnosis is None:
            notes[item.id] = "no diagnosis"
        periods = period_results_from_original(item, overall, diagnosis)
        if ub is not None:
            for period in periods:
                for entry in period.items:
                    row = ub[index][period.period_index]
                    entry.upper_bound_correct = row[entry.question_index] >= 0.5
        users[item.id] = UserResult(user_id=item.id, periods=periods)
    return users, notes


# ----- ours --------------------------------------------------------------------------------------


def run_ours(
    args: argparse.Namespace, base_url: str, model: str, env_file: Path, specs: dict[str, str]
) -> int:
    """One `evolve eval --protocol paper` per policy (so the stub's log tags each); the
    upper bound is computed once and shared through its cache. Returns the worst exit code."""
    worst = 0
    for agent, spec in specs.items():
        command = [sys.executable, "-m", "evolve.cli", "eval", "--env", str(env_file)]
        command += ["--protocol", "paper", "--base-url", base_url, "--model", model]
        command += ["--out", str(args.out / "ours"), "--concurrency", "1", "--no-llm-cache"]
        command += ["--max-tokens", str(args.max_tokens)]  # the reference's completion limit
        command += ["--rounds-init", str(args.rounds_init)]
        command += ["--rounds-update", str(args.rounds_update)]
        command += ["--upper-bound-cache", str(args.out / "ours-upper-bound")]
        command += ["--policy", spec]
        if args.no_upper_bound:
            command.append("--no-upper-bound")
        log = args.out / "logs" / f"ours-{agent}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        environ = os.environ | {"PYTHONPATH": str(REPO)}
        environ.setdefault("OPENAI_API_KEY", "local-no-key")
        # Our external store embeds through the same endpoint and model as the reference's.
        environ["MEMORY_POLICIES_EMBEDDER"] = f"openai:{args.embedding_model}"
        environ["OPENAI_BASE_URL"] = args.embeddings_base_url or base_url
        tag_requests(base_url, f"ours {agent}")
        with open(log, "w") as handle:
            code = subprocess.call(command, cwd=REPO, env=environ, stdout=handle, stderr=handle)
        print(
            f"ours {agent} (evolve eval --protocol paper): exit {code} (log {log})", file=sys.stderr
        )
        worst = worst or code
    return worst


def run_both_sides(
    args: argparse.Namespace,
    base_url: str,
    model: str,
    env_file: Path,
    agents: list[str],
    specs: dict[str, str],
) -> tuple[dict[str, str], int]:
    """The reference's steps and ours: one after the other against the scripted stub (its log
    tags each request with the step that sent it, so steps must not overlap), else at the same
    time. Why at the same time: each side sends one request at a time, so on a local server
    with two slots (the embedded one has them) the second side decodes in the otherwise idle
    slot, and a CPU-bound cross-check takes about half the wall time. What it costs: batched
    decoding can flip a greedy token where two are nearly tied, which is sampling noise of the
    kind the table's noise band covers (the simulated user samples at 0.2 on both sides)."""
    ours = {agent: specs[agent] for agent in agents}
    if args.stub or args.sequential:
        failures = run_reference(args, base_url, model, env_file, agents)
        return failures, run_ours(args, base_url, model, env_file, ours)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="cross-check") as pool:
        reference = pool.submit(run_reference, args, base_url, model, env_file, agents)
        our_code = pool.submit(run_ours, args, base_url, model, env_file, ours)
        return reference.result(), our_code.result()


def our_report(out: Path, spec: str) -> dict[str, Any] | None:
    name = safe_name(spec.replace(":", "-"))
    report = out / "ours" / name / "report.json"
    return json.loads(report.read_text()) if report.exists() else None


# ----- table -------------------------------------------------------------------------------------

COLUMNS = [
    ("acc", "accuracy"),
    ("acc+rf", "accuracy_with_random_fallback"),
    ("memory(orig)", "memory_score_original"),
    ("memory(ours)", "memory_score"),
    ("UB", "upper_bound_score"),
    ("write/item", "original_write_failures"),
    ("read/item", "original_read_failures"),
    ("mem success", "memory_success"),
]


def format_rows(rows: list[tuple[str, MetricSummary | None, str]]) -> str:
    width = max(len(label) for label, _, _ in rows)
    header = f"{'':<{width}} " + " ".join(f"{title:>12}" for title, _ in COLUMNS)
    header += f" {'items':>5} {'answer!':>7} {'probe!':>6}"
    lines = [header, "-" * len(header)]
    for label, summary, note in rows:
        if summary is None:
            lines.append(f"{label:<{width}} (no results: {note})")
            continue
        cells = []
        for _, field in COLUMNS:
            value = getattr(summary, field)
            cells.append(f"{'-' if value is None else f'{value:.3f}':>12}")
        failures = summary.parse_failures
        lines.append(
            f"{label:<{width}} {' '.join(cells)} {summary.n_items:>5} "
            f"{failures.get('answer', 0):>7} {failures.get('probe', 0):>6}"
            + (f"  ({note})" if note else "")
        )
    return "\n".join(lines)


def common_periods(
    out: Path, env: Environment, agent: str, spec: str
) -> tuple[list[UserResult], list[UserResult]] | None:
    """Both sides' scores on the user-periods both finished: like for like where a side
    stopped early (the reference crashes on some model outputs; a run may be cut short).
    Ours are read per period (`users/<id>/period_NN/result.json`), so an unfinished run
    counts too."""
    name = safe_name(spec.replace(":", "-"))
    reference: list[UserResult] = []
    ours: list[UserResult] = []
    for item in env.items:
        overall_file = out / "reference" / agent / item.id / "overall_results.json"
        if not overall_file.exists():
            continue
        raw = json.loads(overall_file.read_text())
        finished = 0
        while finished < len(raw) and raw[finished] and all(e is not None for e in raw[finished]):
            finished += 1
        if not finished:
            continue
        parsed = parse_overall_results(raw[:finished])
        for period in period_results_from_original(item, parsed, None):
            ours_file = (
                out / "ours" / name / "users" / item.id / f"period_{period.period_index:02d}"
                / "result.json"
            )  # fmt: skip
            if ours_file.exists():
                ours_period = PeriodResult.model_validate_json(ours_file.read_text())
                reference.append(UserResult(user_id=item.id, periods=[period]))
                ours.append(UserResult(user_id=item.id, periods=[ours_period]))
    if not reference:
        return None
    return reference, ours


def format_common_periods(
    rows: list[tuple[str, tuple[list[UserResult], list[UserResult]] | None]],
) -> str:
    """Per agent, ours minus the reference on the user-periods both sides finished, as a
    paired test: the same users and questions on both sides, clustered by user, with the
    interval and McNemar's counts (`evolve.stats.compare`); the verdict is read from the
    interval, so "within noise" means the two implementations are not told apart here."""
    lines = ["like for like: ours - reference on the user-periods both sides finished (paired)"]
    for agent, pair in rows:
        if pair is None:
            lines.append(f"  {agent:<7} (no user-period finished on both sides)")
            continue
        reference, ours = (outcomes_from_users(users) for users in pair)
        if not reference.questions:
            lines.append(f"  {agent:<7} (no question scored on both sides)")
            continue
        try:
            comparison = compare(ours, reference)
        except PairingError as error:
            lines.append(f"  {agent:<7} (not paired: {error})")
            continue
        lines.append(
            f"  {agent:<7} reference {reference.correct.mean():.3f}, ours "
            f"{ours.correct.mean():.3f}: {comparison.describe()}"
        )
    return "\n".join(lines)


def format_differences(pairs: list[tuple[str, MetricSummary | None, MetricSummary | None]]) -> str:
    """Per agent: ours minus the reference in accuracy over each side's whole run. No verdict
    here: the two sides' questions are paired, so the test is the like-for-like line below
    (two accuracies side by side would ignore that pairing)."""
    lines = ["ours - reference, accuracy over each whole run (the test: like for like, below)"]
    for agent, reference, ours in pairs:
        if reference is None or ours is None:
            lines.append(f"  {agent:<7} (one side has no results)")
            continue
        if reference.accuracy is None or ours.accuracy is None:
            lines.append(f"  {agent:<7} (no accuracy on one side)")
            continue
        gap = ours.accuracy - reference.accuracy
        lines.append(f"  {agent:<7} {gap:+.3f}  ({reference.n_items} vs {ours.n_items} items)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out = args.out.resolve()
    args.reference = args.reference.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    env_file = args.out / "environment.json"
    if args.table_only:
        if not env_file.exists():
            raise SystemExit(f"--table-only: no {env_file}; run the cross-check into --out first")
        env = load_environment(env_file)
    elif args.env is not None:
        env = load_environment(args.env)
    else:
        env = synthesize_environment(get_preset(args.preset), args.seed, args.users)
    if not args.table_only:
        save_environment(env, env_file)
    agents = args.agents.split(",")
    specs = {
        "native": args.native_policy,
        "awi": args.awi_policy,
        "awe": args.awe_policy,
        "rag": args.rag_policy,
    }
    if args.table_only:
        model, failures, our_code = args.model or "local", {}, 0
    else:
        with endpoint(args, env_file) as (base_url, model):
            print(f"endpoint {base_url} model {model}; {len(env.items)} users", file=sys.stderr)
            failures, our_code = run_both_sides(args, base_url, model, env_file, agents, specs)
    rows: list[tuple[str, MetricSummary | None, str]] = []
    pairs: list[tuple[str, MetricSummary | None, MetricSummary | None]] = []
    for agent in agents:
        users, notes = reference_results(args.out / "reference", env, agent, model)
        report = our_report(args.out, specs[agent])
        missing = (
            "" if report else ("no report" if args.table_only else f"evolve eval exit {our_code}")
        )
        finished = f"{len(users)} of {len(env.items)} users"
        reference_summary = summarize(list(users.values())) if users else None
        our_summary = MetricSummary.model_validate(report["summary"]) if report else None
        pairs.append((agent, reference_summary, our_summary))
        rows.append(
            (
                f"reference {agent}",
                reference_summary,
                finished if len(users) < len(env.items) else "",
            )
        )
        rows.append((f"ours {specs[agent]}", our_summary, missing))
        for item in env.items:  # per user: like for like where the reference did not finish
            user = users.get(item.id)
            rows.append(
                (
                    f"  reference {agent} {item.id}",
                    summarize([user]) if user else None,
                    notes.get(item.id, ""),
                )
            )
            ours_user = report["per_user"].get(item.id) if report else None
            rows.append(
                (
                    f"  ours {specs[agent]} {item.id}",
                    MetricSummary.model_validate(ours_user) if ours_user else None,
                    missing,
                )
            )
    print(f"cross-check on {env_file} ({len(env.items)} users), endpoint model {model}")
    print(format_rows(rows))
    print(
        "acc: parse failures wrong (reference: its random draws scored as drawn); acc+rf: an "
        "unparseable answer earns its expected random score; memory(orig): plain mean over "
        "user-periods; memory(ours): degenerate periods left out; write/read per item and mem "
        "success: the original's diagnosis (both sides scored by this toolkit's code)"
    )
    print(format_differences(pairs))
    print(
        format_common_periods(
            [(agent, common_periods(args.out, env, agent, specs[agent])) for agent in agents]
        )
    )
    for step, failure in failures.items():
        print(f"reference {step} failed: {failure}")
    return 0 if our_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
