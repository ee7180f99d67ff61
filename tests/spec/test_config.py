"""Experiment specs: the shipped files load, every mistake is reported before any LLM call
with the file, the key path and what was expected."""

from __future__ import annotations

from pathlib import Path

import pytest
from optimize.evolve_helpers import write_spec

from evolve.core.errors import ConfigError, EnvironmentDataError
from evolve.llm.config import LLMConfig
from evolve.spec.config import load_spec, resolve, spec_from_dict
from evolve.stores.tracking_uri import DEFAULT_TRACKING_URI

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


# The paper specs need the published data file: tests/optimize/test_paper_specs.py resolves
# them with a fixture in its place.
@pytest.mark.parametrize("name", ["quickstart"])
def test_shipped_specs_load_and_resolve(name):
    spec = load_spec(EXPERIMENTS / f"{name}.toml")
    resolved = resolve(spec)
    assert spec.name == name
    assert resolved.base_policy.kind in ("in_context", "in_context_quotes")
    train = {item.id for item in resolved.train.items}
    heldout = {item.id for item in resolved.heldout.items}
    assert train and heldout and not train & heldout
    assert isinstance(spec.llm, LLMConfig)


def test_quickstart_is_small_and_embedded():
    spec = load_spec(EXPERIMENTS / "quickstart.toml")
    resolved = resolve(spec)
    assert spec.environment.preset == "recall_crafts" and spec.policy.kind == "in_context_quotes"
    assert spec.optimizer.generations >= 3 and spec.optimizer.reflection_minibatch_size == 1
    assert spec.optimizer.operators == ["list_edit"]
    # The held-out users carry at least 48 questions (8 questions x 3 periods each).
    assert sum(len(item.qas) * len(item.periods) for item in resolved.heldout.items) >= 48
    # The base's types list omits most of the world's domains.
    types = spec.policy.components["write.types_to_remember"]
    assert len(types.splitlines()) <= 2
    assert spec.llm.needs_embedded_server()
    assert len(resolved.train.items) == 2 and len(resolved.heldout.items) == 2
    assert spec.tracking_uri() == DEFAULT_TRACKING_URI


def base_spec(**overrides):
    data = {
        "name": "x",
        "environment": {"preset": "tiny", "users": 3, "train_users": 2, "heldout_users": 1},
        "policy": {"kind": "in_context"},
    }
    for key, value in overrides.items():
        data[key] = value
    return data


def test_unknown_keys_name_the_file_the_path_and_the_valid_keys(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(
        'name = "x"\n[environment]\npreset = "tiny"\n[policy]\nkind = "in_context"\n'
        '[optimizer]\nfeedbak = "complete"\n'
    )
    with pytest.raises(ConfigError) as error:
        load_spec(path)
    message = str(error.value)
    assert str(path) in message
    assert "optimizer.feedbak: unknown key in [optimizer]" in message
    assert "feedback" in message and "mutate_components" in message


def test_unknown_key_in_the_llm_table_lists_endpoint_keys():
    with pytest.raises(ConfigError, match=r"llm\.agent\.api_key: unknown key .*api_key_env"):
        spec_from_dict(base_spec(llm={"agent": {"model": "m", "api_key": "sk-no"}}))


def test_wrong_types_and_ranges_are_explained():
    with pytest.raises(ConfigError, match=r"optimizer\.generations: .*greater than or equal to 0"):
        spec_from_dict(base_spec(optimizer={"generations": -1}))
    with pytest.raises(ConfigError, match=r"optimizer\.feedback: .*'complete'"):
        spec_from_dict(base_spec(optimizer={"feedback": "all"}))
    with pytest.raises(ConfigError, match="name 'my exp' must start"):
        spec_from_dict({**base_spec(), "name": "my exp"})
    with pytest.raises(ConfigError, match="environment: .*exactly one of 'preset'"):
        spec_from_dict(base_spec(environment={"preset": "tiny", "file": "a.json"}))
    with pytest.raises(ConfigError, match="low .* must not exceed high"):
        spec_from_dict(base_spec(optimizer={"parameters": {"top_k": {"low": 5, "high": 2}}}))


def test_per_period_rejects_population_settings():
    with pytest.raises(ConfigError, match=r"\['generations'\] do not apply"):
        spec_from_dict(base_spec(optimizer={"schedule": "per_period", "generations": 3}))


@pytest.mark.parametrize("name", ["bad/name:x?", "a%b", "", " padded ", "..", "tab\there"])
def test_a_registered_model_name_mlflow_would_refuse_is_refused_at_load(name):
    with pytest.raises(ConfigError, match="tracking.registered_model: .*registered model name"):
        spec_from_dict(base_spec(tracking={"registered_model": name}))
    assert spec_from_dict(base_spec(tracking={"registered_model": "my policy.v2_x-1"}))


def test_resolve_checks_components_parameters_and_users():
    with pytest.raises(ConfigError, match="'read'.*not components of a 'in_context'"):
        resolve(spec_from_dict(base_spec(optimizer={"mutate_components": ["read"]})))
    with pytest.raises(ConfigError, match="top_k: not a parameter of a 'in_context'"):
        resolve(
            spec_from_dict(base_spec(optimizer={"parameters": {"top_k": {"low": 1, "high": 3}}}))
        )
    with pytest.raises(ConfigError, match="update_every.low must be at least 1 .*got 0"):
        resolve(
            spec_from_dict(
                base_spec(optimizer={"parameters": {"update_every": {"low": 0, "high": 3}}})
            )
        )
    huge = {"low": 2, "high": 99999999999999999999}
    with pytest.raises(ConfigError, match="update_every.high must be at most 1000 .*got 9999"):
        resolve(spec_from_dict(base_spec(optimizer={"parameters": {"update_every": huge}})))
    with pytest.raises(ConfigError, match="policy: .*'update_every' .* must be at most 1000"):
        resolve(
            spec_from_dict(
                base_spec(policy={"kind": "in_context", "parameters": {"update_every": 10**20}})
            )
        )
    with pytest.raises(ConfigError, match="environment.users = 2 but train_users"):
        resolve(
            spec_from_dict(base_spec(environment={"preset": "tiny", "users": 2, "train_users": 2}))
        )
    with pytest.raises(ConfigError, match="unknown synthesis preset 'huge'"):
        resolve(spec_from_dict(base_spec(environment={"preset": "huge"})))
    with pytest.raises(ConfigError, match="policy: unknown policy kind 'magic'"):
        resolve(spec_from_dict(base_spec(policy={"kind": "magic"})))
    with pytest.raises(ConfigError, match="policy: .*short_term_len.* must be at least 0"):
        resolve(
            spec_from_dict(
                base_spec(policy={"kind": "in_context", "parameters": {"short_term_len": -1}})
            )
        )


def test_train_and_heldout_users_by_id_must_exist_and_be_disjoint(tmp_path):
    environment = """
        file = "env.json"
        train_users = ["user-0", "user-1"]
        heldout_users = ["user-1"]
    """
    with pytest.raises(ConfigError, match=r"users \['user-1'\] are both train and held-out"):
        resolve(load_spec(write_spec(tmp_path, environment=environment)))
    missing = environment.replace('["user-1"]', '["nobody"]')
    with pytest.raises(ConfigError, match=r"no user\(s\) \['nobody'\]"):
        resolve(load_spec(write_spec(tmp_path, environment=missing)))
    by_count = environment.replace('["user-1"]', "2")
    resolved = resolve(load_spec(write_spec(tmp_path, environment=by_count)))
    assert [i.id for i in resolved.heldout.items] == ["user-2", "user-3"]


def test_environment_file_is_relative_to_the_spec_and_must_exist(tmp_path):
    spec = load_spec(write_spec(tmp_path))
    assert resolve(spec).environment_description.startswith(f"file {tmp_path}")
    broken = write_spec(tmp_path, environment='file = "missing.json"')
    with pytest.raises(EnvironmentDataError, match="environment.file: .*missing.json"):
        resolve(load_spec(broken))


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_spec(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_spec(bad)


def test_identity_ignores_budget_tracking_concurrency_and_generations():
    one = spec_from_dict(base_spec())
    two = spec_from_dict(
        {
            **base_spec(optimizer={"generations": 9}),
            "budget": {"max_llm_calls": 5},
            "tracking": {"enabled": False},
            "concurrency": 8,
        }
    )
    assert one.identity() == two.identity()
    three = spec_from_dict(base_spec(optimizer={"feedback": "question_only"}))
    assert one.identity() != three.identity()


def test_identity_is_stable_when_the_spec_format_gains_an_option_with_a_default():
    # An option left at its default is not part of the identity, so experiment directories
    # made before the option existed still resume.
    plain = spec_from_dict(base_spec())
    explicit_default = spec_from_dict(base_spec(optimizer={"feedback": "diagnostic"}))
    assert plain.identity() == explicit_default.identity()


@pytest.mark.parametrize(
    ("key", "replacement"),
    [
        ("candidates_per_generation = 2", "generations"),
        ("population_size = 3", "candidate_selection"),
        ('selection = "pareto"', "candidate_selection"),
        ("parameter_mutation_rate = 0.5", "module_selector"),
    ],
)
def test_retired_population_keys_name_their_replacement(tmp_path, key, replacement):
    spec = tmp_path / "exp.toml"
    spec.write_text(
        f'name = "exp"\n[environment]\npreset = "tiny"\n[optimizer]\n{key}\n', encoding="utf-8"
    )
    with pytest.raises(ConfigError) as raised:
        load_spec(spec)
    message = str(raised.value)
    assert "\n" not in message and "no longer applies" in message
    assert f"`{replacement}`" in message


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("r1\n", "control characters"),  # `$` matched before a final newline
        ("../r1", "must start with a letter or digit"),
        ("r" * 5000, "has 5000 characters"),
        ("r1.", "must not end with '.'"),  # Windows drops it: r1. and r1 would be one folder
        ("r1..", "must not end with '.'"),
        ("CON", "reserved on Windows"),
        ("lpt3.x", "reserved on Windows"),
    ],
)
def test_run_names_that_would_break_their_folder_are_refused(name, message):
    with pytest.raises(ConfigError, match=message) as error:
        spec_from_dict({**base_spec(), "name": name})
    assert len(str(error.value)) < 600  # a long name is cut, not echoed whole


def test_experiment_names_with_control_characters_are_refused():
    with pytest.raises(ConfigError, match="control character"):
        spec_from_dict(base_spec(tracking={"experiment_name": "team\tbench"}))


def test_a_spec_synthesizes_only_the_users_its_splits_use():
    from evolve.simulator.synthesis.offline import synthesize_environment
    from evolve.simulator.synthesis.presets import get_preset

    full = synthesize_environment(get_preset("tiny"), 0, 40).items
    counted = resolve(spec_from_dict(base_spec(environment={"preset": "tiny", "users": 40})))
    assert [item.id for item in counted.environment.items] == [item.id for item in full[:3]]
    assert counted.environment.items == full[:3]  # the same users as a full synthesis
    picked = {"train_users": [full[30].id], "heldout_users": [full[7].id, full[12].id]}
    by_id = resolve(
        spec_from_dict(base_spec(environment={"preset": "tiny", "users": 40, **picked}))
    )
    assert [item.id for item in by_id.environment.items] == [full[i].id for i in (7, 12, 30)]
    assert [item.id for item in by_id.heldout.items] == [full[7].id, full[12].id]


def test_a_huge_user_count_is_refused_in_one_line_at_once():
    import time

    started = time.monotonic()
    with pytest.raises(ConfigError, match="environment.users = 100000000; at most 10000"):
        resolve(spec_from_dict(base_spec(environment={"preset": "tiny", "users": 100_000_000})))
    assert time.monotonic() - started < 5
    with pytest.raises(ConfigError, match="at most 10000") as refused:
        resolve(spec_from_dict(base_spec(environment={"preset": "tiny", "users": 10**1000})))
    assert len(str(refused.value)) < 400  # a huge value is cut, not echoed whole


def test_generations_without_any_budget_are_bounded():
    with pytest.raises(ConfigError, match=r"generations = 1000000000 with no \[budget\]"):
        spec_from_dict(base_spec(optimizer={"generations": 1_000_000_000}))
    spec = spec_from_dict(
        base_spec(optimizer={"generations": 1_000_000_000}, budget={"max_llm_calls": 5000})
    )
    assert spec.optimizer.generations == 1_000_000_000
    assert spec_from_dict(base_spec(optimizer={"generations": 100})).optimizer.generations == 100
