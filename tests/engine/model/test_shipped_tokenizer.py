"""The bundled model's tokenizer ships converted (written at build time), is found by the GGUF's
content wherever the file is installed, equals a fresh conversion, and a stale or damaged copy
falls back to converting."""

import logging
import os
import shutil

import pytest
from tiny_models import bundled_tokenizer, make_tiny_gguf
from tokenizer_checks import assert_same_tokenizer

import kvscope.engine.model.tokenizer_cache as tokenizer_cache
from kvscope.engine.model.gguf.file import read_gguf
from kvscope.engine.model.loader import default_model_path, load_model
from kvscope.engine.model.ship_tokenizer import write_shipped
from kvscope.engine.model.tokenizer_cache import (
    cache_root,
    content_key,
    shipped_root,
    shipped_tokenizer,
)

CONVERTING = "Converting the tokenizer"


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def shipped(tmp_path, monkeypatch):
    """A scratch shipped folder in place of the package's."""
    root = tmp_path / "shipped"
    monkeypatch.setattr(tokenizer_cache, "shipped_root", lambda: root)
    return root


@pytest.fixture
def tiny(tmp_path):
    (tmp_path / "build").mkdir()
    return make_tiny_gguf("llama", tmp_path / "build" / "tiny.gguf")[0]


def progress_of_load(path):
    lines = []
    tokenizer = load_model(path, progress=lines.append).tokenizer
    return tokenizer, lines


def test_the_package_ships_the_bundled_tokenizer_as_a_fresh_conversion():
    metadata = read_gguf(default_model_path()).metadata
    entry = shipped_root() / content_key(metadata)
    assert entry.is_dir(), (
        f"{entry} is missing: `make setup` writes it "
        "(python -m kvscope.engine.model.ship_tokenizer --write); after a transformers upgrade it "
        "must be written again"
    )
    assert_same_tokenizer(bundled_tokenizer(), shipped_tokenizer(metadata))


def test_a_first_launch_loads_the_bundled_model_without_converting(data_dir):
    tokenizer, lines = progress_of_load(None)
    assert not [line for line in lines if CONVERTING in line], lines
    assert not cache_root().exists()  # nothing converted, so nothing written for this user
    assert tokenizer("Hello world").input_ids


def test_an_entry_is_found_by_content_from_another_path(tiny, tmp_path, shipped):
    write_shipped(tiny, shipped)
    installed = tmp_path / "installed" / "renamed.gguf"
    installed.parent.mkdir()
    shutil.copyfile(tiny, installed)  # another path, name and mtime: the same tokenizer
    os.utime(installed, ns=(1, 10**18))
    tokenizer, lines = progress_of_load(installed)
    assert not [line for line in lines if CONVERTING in line], lines
    assert_same_tokenizer(tokenizer_cache._load(next(shipped.iterdir())), tokenizer)


def test_a_stale_shipped_entry_is_passed_over(tiny, shipped, monkeypatch):
    write_shipped(tiny, shipped)
    fresh = load_model(tiny).tokenizer  # from the shipped copy
    # Built by another transformers version: the key differs, so the copy is not used.
    monkeypatch.setattr(tokenizer_cache.transformers, "__version__", "99.0.0")
    assert shipped_tokenizer(read_gguf(tiny).metadata) is None
    tokenizer, lines = progress_of_load(tiny)
    assert [line for line in lines if CONVERTING in line]
    assert_same_tokenizer(fresh, tokenizer)


def test_a_damaged_shipped_entry_converts_and_says_so(tiny, shipped, caplog, monkeypatch):
    # import-linter's run (tests/repo/test_import_contracts.py) disables the loggers that exist
    # then.
    monkeypatch.setattr(tokenizer_cache.logger, "disabled", False)
    entry = write_shipped(tiny, shipped)
    (entry / "tokenizer.json").write_text('{"model": ')
    with caplog.at_level(logging.WARNING):
        tokenizer, lines = progress_of_load(tiny)
    assert "unreadable" in caplog.text and [line for line in lines if CONVERTING in line]
    assert tokenizer("hi").input_ids
    assert (entry / "tokenizer.json").read_text() == '{"model": '  # the package is left alone


def test_writing_again_replaces_the_previous_build(tiny, shipped, monkeypatch):
    old = write_shipped(tiny, shipped)
    monkeypatch.setattr(tokenizer_cache.transformers, "__version__", "99.0.0")
    new = write_shipped(tiny, shipped)
    assert new != old and [p.name for p in shipped.iterdir()] == [new.name]
    assert oct(new.stat().st_mode & 0o777) == "0o755"  # readable by every user of an install
