"""setuptools, run on a temporary copy of the sources: building leaves this tree clean.

setuptools writes `build/` and `*.egg-info` next to the pyproject.toml it builds, so an
in-tree build (`pip install ./dist/memory-policies`, `pip wheel`, `python -m build`) would
leave them in the repository. Every hook that writes runs in a temporary directory that
mirrors the layout `package-dir` points into (`../../memory_policies`); paths the frontend
passes in are made absolute first. Editable installs build in place: they exist to point at
this tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from setuptools import build_meta as _setuptools
from setuptools.build_meta import (  # noqa: F401 - the editable hooks, unchanged
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

PROJECT_FILES = ("pyproject.toml", "README.md")
PACKAGE = "memory_policies"  # at ../../memory_policies, as package-dir says


@contextmanager
def _in_temporary_copy() -> Iterator[None]:
    project = Path.cwd()
    repository = project.parents[1]
    with tempfile.TemporaryDirectory(prefix="memory-policies-build-") as temporary:
        copy_project = Path(temporary) / project.relative_to(repository)
        copy_project.mkdir(parents=True)
        for name in PROJECT_FILES:
            shutil.copyfile(project / name, copy_project / name)  # README.md is a symlink
        shutil.copytree(
            repository / PACKAGE,
            Path(temporary) / PACKAGE,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
        )
        os.chdir(copy_project)
        try:
            yield
        finally:
            os.chdir(project)


def _absolute(directory: str | None) -> str | None:
    return None if directory is None else os.path.abspath(directory)


def get_requires_for_build_wheel(config_settings=None):
    with _in_temporary_copy():
        return _setuptools.get_requires_for_build_wheel(config_settings)


def get_requires_for_build_sdist(config_settings=None):
    with _in_temporary_copy():
        return _setuptools.get_requires_for_build_sdist(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    metadata_directory = _absolute(metadata_directory)
    with _in_temporary_copy():
        return _setuptools.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    wheel_directory, metadata_directory = _absolute(wheel_directory), _absolute(metadata_directory)
    with _in_temporary_copy():
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    sdist_directory = _absolute(sdist_directory)
    with _in_temporary_copy():
        return _setuptools.build_sdist(sdist_directory, config_settings)
