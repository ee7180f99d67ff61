"""`evolve ui [TARGET]`: MLflow's UI on a run's store, opened on the experiment's scored runs.

MLflow decides what a browser first shows: 3.17 opens every experiment as a GenAI app (an
empty overview) and keeps the runs table's columns in the browser, so a new user sees no
score. This command starts `mlflow ui` on the store (none for a tracking server), writes
the experiment's shared runs view (`evolve.tracking.runs_view`: score columns, newest run
first) and opens its address, which asks for the model-training view. It serves until
Ctrl-C, like `mlflow ui`.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import webbrowser
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from evolve.core.errors import ConfigError
from evolve.spec.experiment_spec import MLFLOW_EXPERIMENT_PREFIX
from evolve.stores.tracking_uri import (
    DEFAULT_TRACKING_URI,
    SOURCE_SPEC,
    check_tracking_uri,
    masked_uri,
    resolve_tracking_uri,
    sqlite_file,
)
from evolve.tracking.runs_view import runs_view_route

DEFAULT_PORT = 5000
DEFAULT_HOST = "127.0.0.1"
DEFAULT_EXPERIMENT = "0"  # MLflow's "Default", never one of ours


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ui",
        help="open MLflow's UI on an experiment's runs, with their scores as columns",
        description="Start `mlflow ui` on the store a run used (not for a tracking server: "
        "its address is opened instead) and open the experiment's runs table in a browser: "
        "newest run first, with train, validation and held-out scores as columns. Without a "
        "browser it prints the address. Serves until Ctrl-C.",
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="SPEC|EXPERIMENT",
        help="experiment or tuning spec (.toml), or an MLflow experiment name or id "
        "(default: the store's most recently updated experiment)",
    )
    parser.add_argument(
        "--tracking-uri",
        help="MLflow tracking URI (default: the spec's [tracking] tracking_uri, else "
        "MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db in the current directory)",
    )
    parser.add_argument("--host", default=DEFAULT_HOST, help="address to serve on")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to serve on")
    parser.add_argument(
        "--no-browser", action="store_true", help="print the address, do not open a browser"
    )
    parser.set_defaults(handler=run_ui)


def _spec_settings(target: str | None) -> tuple[str | None, str | None]:
    """(MLflow experiment name, configured tracking URI) of a spec file, else (None, None)."""
    if target is None or Path(target).suffix != ".toml":
        return None, None
    if not Path(target).is_file():
        raise ConfigError(f"no spec file {target}; pass an existing .toml or an experiment name")
    from evolve.spec.config import load_spec
    from evolve.tuning.spec import is_study_spec, load_study_spec

    spec: Any = load_study_spec(target) if is_study_spec(Path(target)) else load_spec(target)
    return spec.mlflow_experiment_name(), spec.tracking.tracking_uri


def find_experiment(client: Any, name_or_id: str | None, uri: str) -> Any:
    """The experiment named (or numbered) `name_or_id`, else the most recently updated one
    other than MLflow's Default; one line naming the store's experiments when none is found."""
    from mlflow.exceptions import MlflowException

    experiments = [
        e
        for e in client.search_experiments(order_by=["last_update_time DESC"])
        if e.experiment_id != DEFAULT_EXPERIMENT
    ]
    if name_or_id is not None:
        # As given, else as `evolve run` names an experiment's (`[tracking] experiment_name`
        # unset): `quickstart` is `amemgym-evolve/quickstart`.
        found = client.get_experiment_by_name(name_or_id) or client.get_experiment_by_name(
            f"{MLFLOW_EXPERIMENT_PREFIX}{name_or_id}"
        )
        if found is None and name_or_id.isdigit():
            try:
                found = client.get_experiment(name_or_id)
            except MlflowException:
                found = None
        if found is not None:
            return found
        names = ", ".join(e.name for e in experiments[:8]) or "none"
        raise ConfigError(
            f"no MLflow experiment {name_or_id!r} in {masked_uri(uri)} (it has: {names}); "
            "pass one of those, or the store the run used with --tracking-uri"
        )
    if not experiments:
        raise ConfigError(
            f"the MLflow store {masked_uri(uri)} has no experiment yet; run one first "
            "(`evolve run experiments/quickstart.toml`) or pass --tracking-uri"
        )
    return experiments[0]


def run_ui(args: argparse.Namespace) -> int:
    import mlflow

    from evolve.tracking.runs_view import publish_runs_view
    from evolve.tracking.ui_server import running_ui

    spec_experiment, configured = _spec_settings(args.target)
    location = resolve_tracking_uri(args.tracking_uri, configured, configured_source=SOURCE_SPEC)
    uri = location.uri
    db_path = sqlite_file(uri)
    if db_path is not None and not db_path.is_file():
        raise ConfigError(
            f"no MLflow store at {db_path} (tracking URI {uri}, from {location.source}); run "
            "an experiment first, run this from the directory it ran in, or pass --tracking-uri"
        )
    check_tracking_uri(uri)
    print(location.describe(), file=sys.stderr)
    client = mlflow.MlflowClient(uri)
    experiment = find_experiment(client, spec_experiment or args.target, uri)
    columns = publish_runs_view(client, experiment.experiment_id)
    route = runs_view_route(experiment.experiment_id)
    if urlparse(uri).scheme in ("http", "https"):
        _show(masked_uri(uri).rstrip("/") + route, experiment, columns, args.no_browser)
        return 0
    print(f"starting mlflow ui on {masked_uri(uri)} ...", file=sys.stderr)
    with running_ui(uri, host=args.host, port=args.port) as server:
        _show(f"http://{args.host}:{args.port}{route}", experiment, columns, args.no_browser)
        print("serving; stop with Ctrl-C", flush=True)
        try:
            server.wait()
        except KeyboardInterrupt:
            return 0
    return 0


def _show(address: str, experiment: Any, columns: list[str], no_browser: bool) -> None:
    print(f"{experiment.name} (experiment {experiment.experiment_id}): {address}")
    shown = ", ".join(columns) if columns else "none yet (no scored run)"
    print(
        f"  the runs table, newest first; score columns: {shown}. An experiment's parent run "
        "carries its best candidate's scores; click the arrow beside its name to list the "
        "candidates (MLflow opens parent runs collapsed)."
    )
    opened = False
    if not no_browser:
        try:
            opened = webbrowser.get() is not None and webbrowser.open(address)
        except webbrowser.Error:
            opened = False
    if not opened:
        print(
            "  no browser opened: open the address in one (from another machine: "
            "`ssh -L PORT:127.0.0.1:PORT HOST` first, PORT as in the address)"
        )


# The server `mlflow ui` and `evolve ui` start by default.
UI_ADDRESS = "http://127.0.0.1:5000"


def mlflow_ui_hint(uri: str, experiment_id: str | None, target: str | Path | None = None) -> str:
    """The last lines of a command that logged to `uri`: for a server its address of the
    scored runs view; for a local store `evolve ui` (which starts `mlflow ui` and opens
    that view) and, for MLflow users, the `mlflow ui` command and the address by hand."""
    from evolve.tracking.store import normalize_tracking_uri
    from evolve.tracking.ui_server import FAST_UI_ENV, installed_executable

    route = runs_view_route(experiment_id) if experiment_id else "/"
    if urlparse(uri).scheme in ("http", "https"):
        return f"MLflow UI: {masked_uri(uri).rstrip('/')}{route}"
    evolve_ui = [installed_executable(prog="evolve"), "ui"]
    if target:
        evolve_ui.append(str(target))
    if uri not in (DEFAULT_TRACKING_URI, normalize_tracking_uri(DEFAULT_TRACKING_URI)):
        evolve_ui += ["--tracking-uri", masked_uri(uri)]
    environment = " ".join(f"{key}={value}" for key, value in FAST_UI_ENV.items())
    by_hand = [installed_executable(prog="mlflow"), "ui", "--backend-store-uri", masked_uri(uri)]
    return (
        f"MLflow UI: {shlex.join(evolve_ui)}   (serves this store, opens the scored runs)\n"
        f"  or by hand: {environment} {shlex.join(by_hand)} --workers 1, then open "
        f"{UI_ADDRESS}{route}"
    )


def registered_model_hint(
    uri: str, name: str, version: str | None, target: str | Path | None = None
) -> str:
    """The last lines of `evolve export`: the UI command (as `mlflow_ui_hint`) and the
    registered version's page."""
    from urllib.parse import quote

    page = f"/#/models/{quote(name, safe='')}" + (f"/versions/{version}" if version else "")
    server = urlparse(uri).scheme in ("http", "https")
    base = masked_uri(uri).rstrip("/") if server else UI_ADDRESS
    first = mlflow_ui_hint(uri, None, target).splitlines()[0]
    return (
        f"{first}\n  the registered model: {base}{page}"
        if not server
        else f"MLflow UI: {base}{page}"
    )
