"""Every shell and Python block of the README and the docs pages works as written, or says why
it cannot run here.

Blocks run in document order in one scratch sandbox per page (`doc_blocks.make_sandbox`),
against the stub OpenAI server; a non-zero exit fails the page. Before a page runs, its
sandbox holds the quickstart as the docs' first command leaves it (`evolve run
experiments/quickstart.toml`, run once per session against the stub), so pages can compare,
export and load its results. A block that cannot run so is marked on the line before it with
a reason from `doc_blocks.SKIP_REASONS`; an unmarked block in a shell or Python language
that would not be run is a failure, as is a marker with an unknown reason.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from doc_blocks import (
    REPO,
    SKIP_REASONS,
    Block,
    documented_pages,
    extract_blocks,
    make_sandbox,
    run_block,
    sandbox_environment,
)
from stub_server import StubServer

PAGES = documented_pages()
# The first pages a user follows write only where the quickstart does (`runs/`, the MLflow
# store `mlruns/`), never loose files into the repository root.
ROOT_ENTRIES_WRITTEN = {"runs", "mlruns"}
QUICKSTART = Block(
    page=REPO / "README.md",
    line=0,
    language="bash",
    code="evolve run experiments/quickstart.toml\n",
    marker=None,
)


def _failure(outcome) -> str:
    tail = "\n".join(outcome.output.strip().splitlines()[-25:])
    return (
        f"{outcome.block.where}: the documented ```{outcome.block.language} block exited "
        f"{outcome.returncode}:\n{outcome.block.code}\n--- last output lines ---\n{tail}"
    )


@pytest.fixture(scope="module")
def stub():
    with StubServer(latency=0.0) as server:
        yield server


@pytest.fixture(scope="module")
def quickstart_sandbox(tmp_path_factory, stub) -> tuple[Path, Path]:
    """A sandbox in which the quickstart ran (against the stub), and the shared cache dir."""
    cache = tmp_path_factory.mktemp("doc-cache")
    root = make_sandbox(tmp_path_factory.mktemp("doc-base") / "repo")
    outcome = run_block(QUICKSTART, root, sandbox_environment(root, stub.base_url, cache))
    assert outcome.returncode == 0, _failure(outcome)
    return root, cache


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_block_of_the_page_runs_or_says_why_not(page: Path, request, stub, tmp_path):
    blocks, stray = extract_blocks(page)
    problems = stray + [problem for block in blocks if (problem := block.problem())]
    assert not problems, "\n".join(problems)
    runnable = [block for block in blocks if block.runs]
    if not runnable:
        return
    base, cache = request.getfixturevalue("quickstart_sandbox")
    root = tmp_path / "repo"
    shutil.copytree(base, root, symlinks=True)
    # The quickstart recorded its MLflow store by absolute path; this copy uses its own.
    for record in (root / "runs").rglob("*.json"):
        text = record.read_text(encoding="utf-8")
        if str(base) in text:
            record.write_text(text.replace(str(base), str(root)), encoding="utf-8")
    env = sandbox_environment(root, stub.base_url, cache)
    before = {entry.name for entry in root.iterdir()}
    for block in runnable:
        outcome = run_block(block, root, env)
        assert outcome.returncode == 0, _failure(outcome)
    # A user who copies a page's commands finds their files under runs/ (and the store
    # under mlruns/), never beside pyproject.toml.
    written = {entry.name for entry in root.iterdir()} - before - ROOT_ENTRIES_WRITTEN
    # run_block's own scripts for Python blocks are not the page's writes.
    stray = sorted(name for name in written if not name.startswith(".doc-block-"))
    assert not stray, (
        f"{_page_id(page)}: its commands wrote {stray} into the repository root; "
        "write them under runs/ (e.g. --out runs/NAME)"
    )


# ----- the rules themselves (they must be able to fail) ----------------------------------------

PAGE = """# A page

<!-- doc-test: skip needs-real-model -->
```bash
evolve run experiments/quickstart.toml
```

```python
print("runs")
```

```toml
name = "not code to run"
```
"""


def test_blocks_are_found_with_their_markers_and_lines(tmp_path):
    blocks, stray = extract_blocks(tmp_path / "page.md", PAGE)
    assert [(b.line, b.language, b.skip_reason, b.runs) for b in blocks] == [
        (4, "bash", "needs-real-model", False),
        (8, "python", None, True),
        (12, "toml", None, False),
    ]
    assert stray == [] and all(block.problem() is None for block in blocks)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("```shell\nevolve doctor\n```\n", "is never run"),
        ("```pycon\n>>> 1\n```\n", "is never run"),
        ("<!-- doc-test: skip too-slow -->\n```bash\nsleep 1\n```\n", "REASON one of"),
        ("<!-- doc-test: needs-real-model -->\n```bash\nsleep 1\n```\n", "REASON one of"),
        ("```console\nevolve doctor\n```\n", "without a '$ ' command line"),
    ],
    ids=["shell", "pycon", "unknown-reason", "no-skip-word", "console-without-prompt"],
)
def test_a_block_that_would_not_run_unmarked_is_a_problem(tmp_path, text, expected):
    blocks, _ = extract_blocks(tmp_path / "page.md", text)
    problem = blocks[0].problem()
    assert problem is not None and expected in problem


def test_a_marker_before_no_block_is_a_problem(tmp_path):
    text = "<!-- doc-test: skip needs-api-key -->\nSome prose, then no block.\n"
    assert extract_blocks(tmp_path / "page.md", text)[1]
    # A marker quoted inside a table row (as the docs' own list of reasons) is prose.
    table = "| `<!-- doc-test: skip needs-api-key -->` | calls a hosted endpoint |\n"
    assert extract_blocks(tmp_path / "page.md", table)[1] == []


def test_the_reasons_are_the_documented_ones():
    documented = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    for reason in SKIP_REASONS:
        assert f"<!-- doc-test: skip {reason} -->" in documented


def test_a_failing_command_fails_and_a_console_block_runs_its_commands(tmp_path, stub):
    root = make_sandbox(tmp_path / "repo")
    env = sandbox_environment(root, stub.base_url, tmp_path / "cache")
    blocks, _ = extract_blocks(
        tmp_path / "page.md",
        "```bash\ntrue\nfalse\necho never\n```\n"
        "```console\n$ echo from-console \\\n    continued\nfrom-console continued\n```\n"
        "```python\nraise SystemExit(3)\n```\n",
    )
    failing_shell, console, failing_python = (run_block(b, root, env) for b in blocks)
    assert failing_shell.returncode != 0 and "never" not in failing_shell.output
    assert console.returncode == 0 and console.output.strip() == "from-console continued"
    assert failing_python.returncode == 3


def test_the_evolve_shim_points_llm_commands_at_the_stub_only(tmp_path, stub):
    root = make_sandbox(tmp_path / "repo")
    env = sandbox_environment(root, stub.base_url, tmp_path / "cache")
    before = stub.stats()["chat_requests"]
    doctor = run_block(Block(tmp_path, 1, "bash", "evolve doctor\n", None), root, env)
    assert doctor.returncode == 0, doctor.output
    assert stub.stats()["chat_requests"] > before  # the calls reached the stub
    # A command that names its own model is left alone (here: the embedded server, which
    # the sandbox refuses to start, so the attempt fails fast instead of loading a model).
    embedded = run_block(
        Block(tmp_path, 2, "bash", "evolve doctor --model-size 0.5b\n", None), root, env
    )
    assert embedded.returncode != 0 and "no-llama-server-in-doc-tests" in embedded.output
