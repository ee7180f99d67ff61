"""`evolve.simulator` and `evolve.tuning` export their public surface, and only that."""

from __future__ import annotations

import subprocess
import sys

import evolve.simulator
import evolve.tuning


def test_every_simulator_export_resolves_to_its_defining_module():
    for name in evolve.simulator.__all__:
        value = getattr(evolve.simulator, name)
        module = getattr(value, "__module__", None)
        if module is not None:  # constants (PRESETS) have none
            assert module.startswith("evolve.simulator."), (name, module)
    assert set(evolve.simulator.__all__) == set(evolve.simulator._EXPORTS)
    assert set(evolve.simulator.__all__) <= set(dir(evolve.simulator))


def test_an_unknown_simulator_name_is_an_attribute_error():
    try:
        evolve.simulator.no_such_name  # noqa: B018
    except AttributeError as error:
        assert "no_such_name" in str(error)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_the_environment_model_does_not_load_the_runner_or_dspy():
    code = (
        "import sys, evolve.simulator.environment; "
        "print(sorted(m for m in ('dspy', 'evolve.simulator.evaluation') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_tuning_exports_what_users_use():
    assert len(evolve.tuning.__all__) <= 20
    for name in evolve.tuning.__all__:
        assert getattr(evolve.tuning, name) is not None
