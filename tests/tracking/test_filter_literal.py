"""Names with a quote are found by MLflow's searches (which take no escapes)."""

from __future__ import annotations

import pytest

from evolve.core.errors import ConfigError
from evolve.tracking.store import filter_literal, mlflow_client


def test_a_quote_in_a_name_is_matched_by_the_search(tmp_path):
    client = mlflow_client(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.create_experiment("e")
    for name in ("plain", "a'b", 'say "hi"'):
        client.create_run(experiment, tags={"who": name})
        client.create_registered_model(name)
        client.create_model_version(name, source=str(tmp_path))
    for name in ("plain", "a'b", 'say "hi"'):
        runs = client.search_runs([experiment], filter_string=f"tags.who = {filter_literal(name)}")
        assert [run.data.tags["who"] for run in runs] == [name]
        assert len(client.search_model_versions(f"name = {filter_literal(name)}")) == 1


def test_a_name_with_both_quotes_is_refused_in_one_line():
    with pytest.raises(ConfigError, match="both kinds of quote"):
        filter_literal("""it's "both\"""")
