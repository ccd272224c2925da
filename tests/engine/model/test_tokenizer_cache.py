"""The on-disk cache of converted GGUF tokenizers: hits equal fresh conversions, damage rebuilds."""

import logging
import os

import platformdirs
import pytest
from tiny_models import bundled_tokenizer, make_tiny_gguf
from tokenizer_checks import assert_same_tokenizer  # noqa: F401
from transformers import AutoTokenizer

from kvscope.engine.model.loader import default_model_path, load_model
from kvscope.engine.model.tokenizer_cache import cache_key, cache_root, cached_tokenizer


class Converter:
    """A convert() callback that counts its calls, to tell cache hits from misses."""

    def __init__(self, make):
        self.make, self.calls = make, 0

    def __call__(self):
        self.calls += 1
        return self.make()


@pytest.fixture(autouse=True)
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


@pytest.fixture
def tiny(tmp_path):
    path = make_tiny_gguf("llama", tmp_path / "tiny.gguf")[0]
    return path, Converter(lambda: AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name))


def test_bundled_cache_hit_equals_fresh_conversion():
    path, convert = default_model_path(), Converter(bundled_tokenizer)
    cached_tokenizer(path, convert)
    hit = cached_tokenizer(path, convert)
    assert convert.calls == 1
    assert_same_tokenizer(bundled_tokenizer(), hit)


def test_entry_is_written_under_data_dir(tiny, data_dir):
    path, convert = tiny
    fresh = cached_tokenizer(path, convert)
    entry = data_dir / "cache" / "tokenizers" / cache_key(path)
    assert cache_root() == entry.parent and (entry / "tokenizer.json").is_file()
    assert [p.name for p in entry.parent.iterdir()] == [entry.name]  # no staging leftovers
    assert_same_tokenizer(fresh, cached_tokenizer(path, convert))
    assert convert.calls == 1


def test_platform_cache_dir_without_data_dir(tiny, tmp_path, monkeypatch):
    monkeypatch.delenv("KVSCOPE_DATA_DIR")
    monkeypatch.setattr(platformdirs, "user_cache_dir", lambda app: str(tmp_path / app))
    assert cache_root() == tmp_path / "KVScope" / "tokenizers"
    cached_tokenizer(*tiny)
    assert (cache_root() / cache_key(tiny[0]) / "tokenizer.json").is_file()


@pytest.mark.parametrize("damage", ["garbage tokenizer.json", "missing template", "bad manifest"])
def test_damaged_entry_is_rebuilt(tiny, damage, caplog):
    path, convert = tiny
    fresh = cached_tokenizer(path, convert)
    entry = cache_root() / cache_key(path)
    if damage == "garbage tokenizer.json":
        (entry / "tokenizer.json").write_text('{"model": ')
    elif damage == "missing template":
        (entry / "chat_template.jinja").unlink()
    else:
        (entry / "kvscope-tokenizer-cache.json").write_text("[]")
    with caplog.at_level(logging.WARNING):
        rebuilt = cached_tokenizer(path, convert)
    assert convert.calls == 2 and "rebuilding" in caplog.text
    assert_same_tokenizer(fresh, rebuilt)
    cached_tokenizer(path, convert)
    assert convert.calls == 2  # the rebuilt entry is a good one


def test_changed_file_misses(tiny):
    path, convert = tiny
    cached_tokenizer(path, convert)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cached_tokenizer(path, convert)
    assert convert.calls == 2


def test_failed_store_keeps_tokenizer_and_leaves_nothing(tiny, caplog):
    tokenizer = tiny[1]()

    def full_disk(folder, **kwargs):
        open(os.path.join(folder, "tokenizer.json"), "w").close()  # half written, then full
        raise OSError("No space left on device")

    tokenizer.save_pretrained = full_disk
    with caplog.at_level(logging.WARNING):
        assert cached_tokenizer(tiny[0], lambda: tokenizer) is tokenizer
    assert "No space left" in caplog.text
    assert list(cache_root().iterdir()) == []


def test_gguf_load_uses_the_cache(tiny):
    path = tiny[0]
    first = load_model(path).tokenizer
    assert (cache_root() / cache_key(path) / "tokenizer.json").is_file()
    assert_same_tokenizer(first, load_model(path).tokenizer)


def test_a_full_disk_does_not_fail_the_load(tiny, monkeypatch, caplog):
    """tokenizers reports ENOSPC as a plain Exception from save_pretrained: the model still
    loads, uncached, with a warning."""
    path, convert = tiny
    real = convert.make

    def converted_on_a_full_disk():
        tokenizer = real()

        def no_space(*args, **kwargs):
            raise Exception("No space left on device (os error 28)")

        monkeypatch.setattr(tokenizer, "save_pretrained", no_space)
        return tokenizer

    convert.make = converted_on_a_full_disk
    with caplog.at_level(logging.WARNING):
        tokenizer = cached_tokenizer(path, convert)
    assert tokenizer("hi").input_ids
    assert "No space left on device" in caplog.text
    assert not (cache_root() / cache_key(path)).exists()
