"""The paper's Table 3 specs: protocol paper, the published v1.base file, all 20 users in
chains with no held-out users. The published file is not in the repository: resolution is
tested with a fixture in its place (a data.json written as `evolve env synthesize` writes it),
and a missing file is a one-line error naming its path."""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

import pytest
from optimize.evolve_helpers import write_spec

from evolve.core.errors import ConfigError, EnvironmentDataError
from evolve.core.protocol import PAPER
from evolve.simulator.environment import save_environment
from evolve.simulator.synthesis.offline import synthesize_environment
from evolve.simulator.synthesis.presets import get_preset
from evolve.spec.config import load_spec, resolve, spec_from_dict

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
FEEDBACKS = ("complete", "question_only", "none")


@pytest.fixture(scope="module")
def published_stand_in(tmp_path_factory) -> Path:
    """20 users in the original data.json format, standing in for v1.base/data.json."""
    path = tmp_path_factory.mktemp("data") / "data.json"
    save_environment(synthesize_environment(get_preset("tiny"), 0, 20), path)
    return path


def with_file(name: str, data_file: Path):
    source = EXPERIMENTS / f"paper_table3_{name}.toml"
    data = tomllib.loads(source.read_text(encoding="utf-8"))
    assert data["environment"]["file"] == "../data/v1.base/data.json"
    data["environment"]["file"] = str(data_file)
    return spec_from_dict(data, source=source)


@pytest.mark.parametrize("feedback", FEEDBACKS)
def test_paper_specs_resolve_to_the_papers_setup(feedback, published_stand_in):
    spec = with_file(feedback, published_stand_in)
    resolved = resolve(spec)
    assert spec.protocol == "paper" and resolved.episode.protocol == "paper"
    assert spec.optimizer.schedule == "per_period"
    assert spec.optimizer.feedback == feedback
    assert spec.optimizer.mutate_components == ["write.types_to_remember"]
    assert "reflector_temperature" not in spec.optimizer.model_fields_set  # paper: 0
    assert spec.policy.kind == "in_context"
    assert spec.policy.parameters == {"update_every": 2, "short_term_len": 4}
    # All 20 users evolve their own chain; none is held out.
    assert len(resolved.train.items) == 20 and resolved.heldout.items == []
    # A data file under the paper protocol: 1 round in period 0, 2 afterwards.
    assert (resolved.episode.rounds_initial, resolved.episode.rounds_update) == (1, 2)
    assert spec.llm.default.model == "gpt-4.1-mini" and spec.llm.reflector is None
    assert spec.identity()["protocol"] == "paper"


@pytest.mark.parametrize("feedback", FEEDBACKS)
def test_a_paper_spec_without_the_published_file_names_its_path(feedback, tmp_path):
    experiments = tmp_path / "experiments"
    experiments.mkdir()
    copy = experiments / f"paper_table3_{feedback}.toml"
    shutil.copy(EXPERIMENTS / copy.name, copy)
    with pytest.raises(EnvironmentDataError) as error:
        resolve(load_spec(copy))
    message = str(error.value)
    assert "\n" not in message
    assert str(tmp_path / "experiments" / ".." / "data" / "v1.base" / "data.json") in message
    assert "Published data" in message


def test_the_published_file_is_git_ignored():
    ignored = (EXPERIMENTS.parent / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "data/v1.base/data.json" in ignored


def test_no_heldout_users_only_for_the_per_user_chains(tmp_path):
    chains = write_spec(
        tmp_path,
        environment='file = "env.json"\ntrain_users = 2\nheldout_users = 0',
        optimizer='schedule = "per_period"',
    )
    assert resolve(load_spec(chains)).heldout.items == []
    population = write_spec(
        tmp_path, name="pop", environment='file = "env.json"\ntrain_users = 2\nheldout_users = 0'
    )
    with pytest.raises(ConfigError, match='heldout_users = 0.*schedule = "per_period"'):
        resolve(load_spec(population))


def test_complete_under_evolve_points_to_the_rename(tmp_path):
    spec = write_spec(tmp_path, optimizer='feedback = "complete"')
    with pytest.raises(ConfigError) as error:
        resolve(load_spec(spec))
    message = str(error.value)
    assert "\n" not in message and 'feedback = "diagnostic"' in message
    assert 'protocol = "paper"' in message
    paper = write_spec(
        tmp_path, 'protocol = "paper"', name="paper", optimizer='feedback = "complete"'
    )
    assert resolve(load_spec(paper)).spec.optimizer.feedback == "complete"


PAPER_SPECS = sorted(
    path
    for path in EXPERIMENTS.glob("*.toml")
    if tomllib.loads(path.read_text(encoding="utf-8")).get("protocol") == "paper"
)


@pytest.mark.parametrize("path", PAPER_SPECS, ids=lambda path: path.name)
def test_paper_specs_sample_the_simulated_user_and_limit_replies_as_the_reference(
    path, monkeypatch
):
    """The reference's simulator config: temperature 0.2; its agent config: max_tokens 8192.
    The shipped specs leave max_tokens unset so that the protocol's 8192 applies."""
    from evolve.llm import build_lm, protocol_llm_config
    from evolve.tuning import load_study_spec

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")  # build_lm resolves the key; no call
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    llm = load_study_spec(path).llm if "tuning" in data else spec_from_dict(data).llm
    assert "max_tokens" not in data["llm"]["default"]
    config = protocol_llm_config(llm, PAPER)
    simulator = build_lm(config.endpoint_for("simulator"))
    agent = build_lm(config.endpoint_for("agent"))
    assert simulator.kwargs["temperature"] == 0.2
    assert agent.kwargs["max_tokens"] == 8192 and simulator.kwargs["max_tokens"] == 8192
