"""A chat's structured output (Sampling ▸ Structured output): the schema is kept with the chat,
a schema that cannot be used keeps Send from sending, and a usable one makes the engine's reply
follow it, shown indented while the stored text stays what the model wrote."""

from __future__ import annotations

import json

import jsonschema
import pytest
from PySide6.QtGui import QFontDatabase, QGuiApplication

from kvscope.app.desktop.chat.store import ChatStore
from kvscope.app.desktop.chat.structured_output import (
    KEY,
    StructuredOutput,
    json_markdown,
    parse_schema,
    reply_fields,
    with_structured,
)
from kvscope.app.remote.openai_http import request_fields
from kvscope.engine import StructuredOutputsParams

TIMEOUT_MS = 120_000  # the CPU is shared; a reply of a few dozen tokens can take seconds
TRIP = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 20},
        "days": {"type": "integer", "minimum": 1, "maximum": 9},
    },
    "required": ["city", "days"],
}


def _turn_on(window, qtbot, schema_text: str) -> None:
    """Open Sampling, check the box, type the schema and wait out the check's delay."""
    window.chat.sampling_toggle.setChecked(True)
    field = window.chat.sampling.structured
    field.enabled.setChecked(True)
    field.editor.setPlainText(schema_text)
    qtbot.waitUntil(lambda: not field._timer.isActive(), timeout=5_000)


# ---- the setting, without a window -------------------------------------------------------
def test_the_setting_lives_beside_the_sampling_fields():
    sampling = {"temperature": 0.3, "max_tokens": 64}
    on = with_structured(sampling, StructuredOutput(True, '{"type": "object"}'))
    assert on == {**sampling, KEY: {"on": True, "schema": '{"type": "object"}'}}
    assert StructuredOutput.from_sampling(on) == StructuredOutput(True, '{"type": "object"}')
    assert with_structured(on, StructuredOutput()) == sampling  # off and empty: left out
    assert sampling == {"temperature": 0.3, "max_tokens": 64}  # copies, never changed in place
    for damaged in (None, {}, {KEY: "yes"}, {KEY: {"on": 1, "schema": 5}}):
        assert StructuredOutput.from_sampling(damaged) == StructuredOutput()


def test_schema_problems_say_what_and_where():
    assert parse_schema(json.dumps(TRIP)) == TRIP
    with pytest.raises(ValueError, match=r"Not valid JSON: .*\(line 2, column 1\)"):
        parse_schema('{"type": "object",\n')
    with pytest.raises(ValueError, match="No schema"):
        parse_schema("  \n")
    with pytest.raises(ValueError, match="not an array"):
        parse_schema("[1, 2]")


def test_replies_get_the_engines_field_or_openais_response_format():
    [engine] = reply_fields(TRIP, on_engine=True).values()
    assert engine == StructuredOutputsParams(json=TRIP)
    remote = reply_fields(TRIP, on_engine=False)
    body = request_fields({"max_tokens": 64, "temperature": 0.0, **remote})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": TRIP},
    }
    assert "response_format" not in request_fields({"max_tokens": 64})


def test_json_is_indented_in_a_code_block_and_other_text_is_left_alone():
    assert json_markdown('{"city":"Rome","days":3}') == (
        '```json\n{\n  "city": "Rome",\n  "days": 3\n}\n```'
    )
    inner = json_markdown('{"note": "a\\n```\\nfence"}').splitlines()[1:-1]
    assert not any(line.lstrip().startswith("```") for line in inner)  # cannot end the block
    for text in ("", "Rome, 3 days", '{"city": "Ro'):
        assert json_markdown(text) is None


# ---- in the window ---------------------------------------------------------------------------
def test_the_field_round_trips_through_the_store(make_window, qtbot):
    window = make_window()
    field = window.chat.sampling.structured
    plain = window.chats.new_conversation()
    assert not field.enabled.isChecked() and not field.editor.isVisibleTo(window)
    structured = window.chats.new_conversation()
    window.chat.sampling.temperature.setValue(0.4)
    _turn_on(window, qtbot, json.dumps(TRIP, indent=1))
    assert field.editor.isVisibleTo(window)
    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
    assert field.editor.font().family() == fixed.family()  # monospace
    window.chat.sampling.max_tokens.setValue(40)  # a knob after the schema keeps the schema

    other = ChatStore(window.store.path)  # as a restart reads it
    stored = other.conversation(structured).sampling
    other.close()
    assert stored[KEY] == {"on": True, "schema": json.dumps(TRIP, indent=1)}
    assert (stored["temperature"], stored["max_tokens"]) == (0.4, 40)
    assert KEY not in (window.store.conversation(plain).sampling or {})

    window.chats.open_conversation(plain)
    assert not field.enabled.isChecked() and field.editor.toPlainText() == ""
    window.chats.open_conversation(structured)
    assert field.value() == StructuredOutput(True, json.dumps(TRIP, indent=1))
    assert field.editor.isVisibleTo(window)

    field.editor.setPlainText('{"type": "string"}')  # typed, then straight to another chat
    window.chats.open_conversation(plain)
    assert StructuredOutput.from_sampling(window.store.conversation(structured).sampling) == (
        StructuredOutput(True, '{"type": "string"}')
    )
    assert KEY not in (window.store.conversation(plain).sampling or {})

    window.chats.open_conversation(structured)
    field.enabled.setChecked(False)  # off keeps the schema for next time
    assert StructuredOutput.from_sampling(window.store.conversation(structured).sampling) == (
        StructuredOutput(False, '{"type": "string"}')
    )
    assert not field.editor.isVisibleTo(window)


@pytest.mark.parametrize(
    ("schema_text", "said"),
    [
        ('{"type": "object",\n "properties": {', "Not valid JSON"),
        ('{"type": "strin"}', "The engine cannot use this schema: invalid constraint: Invalid"),
        ('{"type": "integer", "minimum": 5, "maximum": 1}', "Unsatisfiable schema"),
    ],
)
def test_a_schema_that_cannot_be_used_keeps_send_from_sending(
    make_window, qtbot, schema_text, said
):
    window = make_window()
    submitted = []
    window.client.submit = lambda *args: submitted.append(args)
    cid = window.chats.new_conversation()
    _turn_on(window, qtbot, schema_text)
    field = window.chat.sampling.structured
    # The engine's answer comes from a thread of its own (the first compile wraps the vocabulary).
    qtbot.waitUntil(lambda: said in field.error.text(), timeout=30_000)
    assert field.error.isVisibleTo(window)

    window.chat.composer.setPlainText("Plan a trip.")
    window.chat.send.click()
    assert window.chat.composer.toPlainText() == "Plan a trip."  # nothing lost
    assert window.store.messages(cid) == [] and submitted == []
    notice = window.chat.notice
    assert notice.isVisibleTo(window) and notice.text().startswith("Not sent: ")
    assert said in notice.text()

    field.enabled.setChecked(False)  # off: the same schema no longer matters
    window.chat.send.click()
    assert [m.content for m in window.store.messages(cid)] == ["Plan a trip."]
    assert "structured_outputs" not in submitted[-1][3]


def test_a_bad_schema_typed_just_before_send_is_caught(make_window, qtbot):
    window = make_window()
    cid = window.chats.new_conversation()
    _turn_on(window, qtbot, json.dumps(TRIP))
    field = window.chat.sampling.structured
    field.editor.setPlainText('{"type": ')  # the check's delay has not run out yet
    window.chat.composer.setPlainText("Plan a trip.")
    window.chat.send.click()
    assert "Not valid JSON" in field.error.text()
    assert window.store.messages(cid) == []
    assert window.chat.composer.toPlainText() == "Plan a trip."


def test_the_engines_reply_follows_the_schema_and_shows_indented(make_window, qtbot):
    window = make_window(max_tokens=64, temperature=0.0)
    submitted = []
    real_submit = window.client.submit
    window.client.submit = lambda *args: (submitted.append(args), real_submit(*args))
    cid = window.chats.new_conversation()
    _turn_on(window, qtbot, json.dumps(TRIP))
    field = window.chat.sampling.structured
    assert not field.error.isVisibleTo(window)

    window.chat.composer.setPlainText("Plan a short trip: which city, how many days?")
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        window.chat.send.click()
    assert done.args == [cid, "complete"]
    assert field.error.text() == ""  # the engine's check found nothing either
    assert submitted[-1][3]["structured_outputs"] == StructuredOutputsParams(json=TRIP)

    reply = window.store.messages(cid)[-1]
    jsonschema.validate(json.loads(reply.content), TRIP)
    assert "\n" not in reply.content  # stored as the model wrote it (compact), not indented
    bubble = window.chat.bubbles()[-1]
    assert bubble.body.markdown() == json_markdown(reply.content)
    assert bubble.body.markdown().startswith("```json\n{\n  ")
    assert bubble.body.copy_buttons()  # drawn as the markdown view draws code
    bubble.copy.click()
    assert QGuiApplication.clipboard().text() == reply.content

    window.chats.open_conversation(cid)  # drawn again from the store: indented again
    assert window.chat.bubbles()[-1].body.markdown() == json_markdown(reply.content)
    field.enabled.setChecked(False)  # off: as written
    assert window.chat.bubbles()[-1].body.markdown() == reply.content
