"""Build tests/fixtures/reference_output/ from one `cross_check.py --stub` run's output.

    .venv/bin/python benchmarks/reference_fixture.py --run /tmp/reffix-run \\
        --to tests/fixtures/reference_output

Copies only data the tests need, never the reference's code or prompt text:

- `environment.json` (ours, the run's input) and `random_metrics.json`;
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
import json
import shutil
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from request_reduction import load_request_log, reduce_log  # noqa: E402

AGENTS = ("native", "awi", "awe", "rag")
PROBE_PLACEHOLDER = "(the reference's probe prompt; not kept)"


def load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def dump(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def copy_user(source: Path, target: Path, diagnosis: bool = True) -> None:
    for name in ("overall_results.json", "overall_metrics.json"):
        dump(target / name, load(source / name))
    if (source / "interactions").is_dir():
        shutil.copytree(source / "interactions", target / "interactions", dirs_exist_ok=True)
    if diagnosis:
        results = load(source / "diagnosis_results.json")
        for row in results:
            for cell in row:
                cell["query"] = PROBE_PLACEHOLDER
        dump(target / "diagnosis_results.json", results)
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
        if old.name != "README.md":
            shutil.rmtree(old) if old.is_dir() else old.unlink()
    dump(target / "environment.json", environment)
    dump(target / "random_metrics.json", load(reference / "random_metrics.json"))
    users = [item["id"] for item in environment]
    for agent in AGENTS:
        for user in users:
            copy_user(reference / agent / user, target / agent / user)
    (upper_bound,) = (reference / "upperbound").iterdir()
    for name in ("utilization_results.json", "utilization_metrics.json"):
        dump(target / "upperbound" / upper_bound.name / name, load(upper_bound / name))
    (chain,) = (reference / "evolution").iterdir()
    for user in users:
        copy_user(chain / user, target / chain.name / user, diagnosis=False)
        dump(target / chain.name / user / "evolution_history.json", evolution_history(chain / user))
    entries = [e for e in load_request_log(run / "requests.jsonl") if e["tag"].startswith("ref")]
    reduced = reduce_log(entries, environment)
    lines = ",\n".join(json.dumps(entry, ensure_ascii=False) for entry in reduced)
    (target / "reference_requests.json").write_text(f"[\n{lines}\n]\n", encoding="utf-8")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--run", type=Path, required=True, help="cross_check.py --stub --out DIR")
    parser.add_argument("--to", type=Path, required=True, help="the fixture directory")
    args = parser.parse_args()
    build(args.run, args.to)
