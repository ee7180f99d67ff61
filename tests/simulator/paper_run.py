"""Our paper mode run end to end against the scripted stub, on the reference fixture's
environment: `evolve eval --protocol paper` for native, AWI (`in_context`), AWE (`external`) and
RAG (`raw_rag`) with the upper bound, and the shipped Table-3 specs' per-user evolution chains
(question-only and complete feedback). The stub answers by the request's content and knows the
environment (its upper bound answers as a model told the state would), so a question, an
upper-bound question or a probe that the reference also asked gets the same answer here as in
the reference's run (`tests/fixtures/reference_output/`).

Used by `test_reference_requests.py` (what each role was shown) and `test_paper_run_per_item.py`
(every item's score against the reference's metric files); the run is made once per session.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from stub_server import StubServer

from evolve.api import run_experiment
from evolve.cli import main
from evolve.spec.config import ExperimentSpec, spec_from_dict

REPO = Path(__file__).resolve().parents[2]
FIXTURE = REPO / "tests" / "fixtures" / "reference_output"
ENVIRONMENT = FIXTURE / "environment.json"
# The session rounds the reference ran with (period 0, later periods).
SETTINGS = json.loads((FIXTURE / "settings.json").read_text(encoding="utf-8"))
ROUNDS = (SETTINGS["num_rounds_init"], SETTINGS["num_rounds_update"])
# Our policy spec per reference agent (the paper variant is the default under --protocol paper).
POLICIES = {"native": "native", "awi": "in_context", "awe": "external", "rag": "raw_rag"}
# The shipped Table-3 spec per reference chain (fixture directory `evolution-<feedback>`).
CHAINS = {
    "question_only": REPO / "experiments" / "paper_table3_question_only.toml",
    "complete": REPO / "experiments" / "paper_table3_complete.toml",
}
# The model the reference's AWE/RAG embed with; ours embeds through the same stub with it.
EMBEDDING_MODEL = "text-embedding-3-small"


@dataclass(frozen=True)
class PaperRun:
    log: Path  # the stub's request log (tags `ours <agent>`, `ours evolution <feedback>`)
    evals: Path  # `evolve eval --out`: one directory per policy
    runs: Path  # `run_experiment`'s runs directory: one per chain spec
    chain_names: dict[str, str]  # feedback -> the chain run's name


def chain_spec(spec_path: Path, base_url: str, uncapped: bool = False) -> ExperimentSpec:
    """A shipped Table-3 spec on the fixture's users, against the stub; `uncapped`: without
    the spec's `max_feedback_chars`."""
    data = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    data["environment"] = {"file": str(ENVIRONMENT), "train_users": 3, "heldout_users": 0}
    data["tracking"] = {"enabled": False}
    data["concurrency"] = 1
    data.setdefault("episode", {}).update(rounds_initial=ROUNDS[0], rounds_update=ROUNDS[1])
    for endpoint in data["llm"].values():
        endpoint["base_url"] = base_url
        endpoint["cache"] = False  # every request must reach the stub's log
    data["llm"]["default"]["model"] = "agent"  # the evals' agent: their upper bound is reused
    if uncapped:
        # The paper's own rule (no cap; the shipped specs set a guard far above any fixture
        # feedback): a cap would drop memories the reference's reflector saw.
        data["optimizer"].pop("max_feedback_chars", None)
    return spec_from_dict(data, source=spec_path)


@pytest.fixture(scope="session")
def paper_run(tmp_path_factory) -> PaperRun:
    directory = tmp_path_factory.mktemp("paper-run")
    log = directory / "requests.jsonl"
    patch = pytest.MonkeyPatch()
    names = {}
    with StubServer(latency=0.0, scripted=True, log=log, environment=ENVIRONMENT) as stub:
        patch.setenv("OPENAI_API_KEY", "stub-key")
        patch.setenv("OPENAI_BASE_URL", stub.base_url)  # our embedder's endpoint
        patch.setenv("MEMORY_POLICIES_EMBEDDER", f"openai:{EMBEDDING_MODEL}")
        # One upper bound for every run, as the reference computes it once: the chains read
        # the evals' cache instead of asking again.
        patch.setenv("EVOLVE_CACHE_DIR", str(directory / "cache"))
        try:
            for agent, spec in POLICIES.items():
                stub.tag(f"ours {agent}")
                argv = ["eval", "--env", str(ENVIRONMENT), "--policy", spec]
                argv += ["--protocol", "paper", "--base-url", stub.base_url, "--model", "agent"]
                argv += ["--out", str(directory / "eval"), "--concurrency", "1", "--no-progress"]
                argv += ["--rounds-init", str(ROUNDS[0]), "--rounds-update", str(ROUNDS[1])]
                argv += [
                    "--no-llm-cache",
                    "--upper-bound-cache",
                    str(directory / "cache" / "upper_bound"),
                ]
                assert main(argv) == 0, f"evolve eval --policy {spec} failed"
            for feedback, spec_path in CHAINS.items():
                stub.tag(f"ours evolution {feedback}")
                # The complete chain (the longer feedback) runs on the paper's default length.
                spec = chain_spec(spec_path, stub.base_url, uncapped=feedback == "complete")
                result = run_experiment(spec, runs_dir=directory / "runs", tracking=False)
                assert result.complete, feedback
                names[feedback] = spec.name
        finally:
            patch.undo()
    return PaperRun(log=log, evals=directory / "eval", runs=directory / "runs", chain_names=names)
