"""Build tests/fixtures/reference_output/ from one `cross_check.py --stub` run's output.

    .venv/bin/python benchmarks/reference_fixture.py --run /tmp/reffix-run \\
        --to tests/fixtures/reference_output

Copies only data the tests need, never the reference's code or prompt text:

- `environment.json` (ours, the run's input), `random_metrics.json` and `settings.json` (the
  session rounds the reference ran with, from its env config);
- per agent (native, awi, awe, rag) and user: `interactions/`, `overall_results.json`,
  `overall_metrics.json`, `diagnosis_results.json` (its `query`, the reference probe prompt
  verbatim, replaced by a placeholder) and `diagnosis_metrics.json`;
- the upper bound's `utilization_results.json` and `utilization_metrics.json`;
- the evolution chain's `overall_results.json`, `overall_metrics.json` and, from its last agent
  state, `evolution_history.json`: per step the feedback and the reflector's list of changes
  (the rewritten prompt, which embeds the reference's template, is dropped);
- `reference_requests.json`: the reference's requests from the stub's log, reduced to what
  each role was shown (`request_reduction.reduce_log`; no prompt text).

Left out: agent states, logs and `agent_config.json` (they hold prompts or the endpoint).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from request_reduction import load_request_log, reduce_log  # noqa: E402

AGENTS = ("native", "awi", "awe", "rag")
README = "README.md"
CHECKSUMS = "SHA256SUMS"
ROUND_SETTINGS = ("num_rounds_init", "num_rounds_update")
PROBE_PLACEHOLDER = "(the reference's probe prompt; not kept)"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def without_timings(data: Any) -> Any:
    """`data` with every `time_elapsed` set to 0.0: wall time is the one field that differs
    between two runs of the reference against the stub, and the fixture must rebuild exactly."""
    if isinstance(data, dict):
        return {k: 0.0 if k == "time_elapsed" else without_timings(v) for k, v in data.items()}
    if isinstance(data, list):
        return [without_timings(v) for v in data]
    return data


def copy_user(source: Path, target: Path, diagnosis: bool = True) -> None:
    for name in ("overall_results.json", "overall_metrics.json"):
        dump(target / name, without_timings(load(source / name)))
    if (source / "interactions").is_dir():
        shutil.copytree(source / "interactions", target / "interactions", dirs_exist_ok=True)
    if diagnosis:
        results = load(source / "diagnosis_results.json")
        for row in results:
            for cell in row:
                cell["query"] = PROBE_PLACEHOLDER
        dump(target / "diagnosis_results.json", without_timings(results))
        dump(target / "diagnosis_metrics.json", load(source / "diagnosis_metrics.json"))


def evolution_history(user_dir: Path) -> list[dict[str, Any]]:
    """The last agent state's evolution steps, without the rewritten prompts."""
    states = sorted((user_dir / "agent_states").glob("period_*/evolution_state.json"))
    history = load(states[-1])["evolution_history"]
    return [
        {
            "step_id": step["step_id"],
            "feedback": step["feedback"],
            "changes": step["changes"].get("changes", {}),
        }
        for step in history
    ]


def build(run: Path, target: Path) -> None:
    reference = run / "reference"
    environment = load(run / "environment.json")
    for old in target.iterdir() if target.exists() else []:  # README.md is written by hand
        if old.name not in (README, CHECKSUMS):
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    dump(target / "environment.json", environment)
    dump(target / "random_metrics.json", load(reference / "random_metrics.json"))
    # The session rounds the reference ran with (its env config): our side must run the same.
    env_config = load(run / "reference-configs" / "env.json")
    dump(target / "settings.json", {key: env_config[key] for key in ROUND_SETTINGS})
    users = [item["id"] for item in environment]
    for agent in AGENTS:
        for user in users:
            copy_user(reference / agent / user, target / agent / user)
    (upper_bound,) = (reference / "upperbound").iterdir()
    for name in ("utilization_results.json", "utilization_metrics.json"):
        dump(
            target / "upperbound" / upper_bound.name / name,
            without_timings(load(upper_bound / name)),
        )
    for chain in sorted((reference / "evolution").iterdir()):  # one per feedback kind
        for user in users:
            copy_user(chain / user, target / chain.name / user, diagnosis=False)
            history = evolution_history(chain / user)
            dump(target / chain.name / user / "evolution_history.json", history)
    entries = [e for e in load_request_log(run / "requests.jsonl") if e["tag"].startswith("ref")]
    reduced = reduce_log(entries, environment)
    lines = ",\n".join(json.dumps(entry, ensure_ascii=False) for entry in reduced)
    (target / "reference_requests.json").write_text(f"[\n{lines}\n]\n", encoding="utf-8")


def checksums(target: Path) -> dict[str, str]:
    """SHA-256 of every fixture file but the hand-written README and the checksum file."""
    return {
        path.relative_to(target).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(target.rglob("*"))
        if path.is_file() and path.name not in (README, CHECKSUMS)
    }


def write_checksums(target: Path) -> None:
    lines = [f"{digest}  {name}" for name, digest in checksums(target).items()]
    (target / CHECKSUMS).write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_checksums(target: Path) -> dict[str, str]:
    lines = (target / CHECKSUMS).read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}


def check(run: Path, fixture: Path) -> list[str]:
    """The files whose rebuild from `run` differs from the fixture's recorded checksums
    (missing, extra or changed); empty when the rebuild reproduces the fixture exactly."""
    with tempfile.TemporaryDirectory() as scratch:
        rebuilt = Path(scratch) / "fixture"
        build(run, rebuilt)
        new = checksums(rebuilt)
    recorded = read_checksums(fixture)
    return sorted(name for name in set(new) | set(recorded) if new.get(name) != recorded.get(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="cross_check.py --stub --out DIR")
    parser.add_argument("--to", type=Path, required=True, help="the fixture directory")
    parser.add_argument(
        "--check",
        action="store_true",
        help=f"rebuild into a scratch directory and compare with --to's {CHECKSUMS}; "
        "exit 1 naming every file that differs",
    )
    args = parser.parse_args(argv)
    if args.check:
        differing = check(args.run, args.to)
        for name in differing:
            print(f"differs from {CHECKSUMS}: {name}")
        print("rebuild reproduces the fixture" if not differing else "rebuild DIFFERS")
        return 1 if differing else 0
    build(args.run, args.to)
    write_checksums(args.to)
    return 0


if __name__ == "__main__":
    sys.exit(main())
