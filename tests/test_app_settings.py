"""Settings: persisted JSON, the dialog and model picker, engine rebuilds, bad models."""

import json

import pytest

from app.settings import (
    DEFAULT_CPU_KV_MIB,
    AppSettings,
    EngineSettings,
    SettingsDialog,
    load_settings,
    save_settings,
)

TIMEOUT_MS = 120_000


def test_settings_round_trip_and_defaults(tmp_path):
    path = tmp_path / "settings.json"
    assert load_settings(path) == AppSettings()  # nothing saved yet
    assert AppSettings().engine.kv_budget_mib == DEFAULT_CPU_KV_MIB == 256
    settings = AppSettings().with_engine(block_size=32, allocator="contiguous")
    settings.sampling.temperature = 0.2
    settings.overflow_policy = "drop_oldest"
    save_settings(settings, path)
    assert load_settings(path) == settings
    kwargs = load_settings(path).engine.llm_kwargs()
    assert kwargs["block_size"] == 32 and kwargs["allocator"] == "contiguous"


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "settings.json"),
        (json.dumps({"engine": {"block_size": 7}}), "block_size 7"),
        (json.dumps({"sampling": {"top_p": 2.0}}), "top_p"),
        (json.dumps({"overflow_policy": "shrug"}), "overflow_policy"),
    ],
)
def test_a_bad_settings_file_names_the_problem(tmp_path, content, match):
    path = tmp_path / "settings.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=match):
        load_settings(path)


def test_dialog_shows_the_model_and_the_planners_prediction(qtbot):
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=64)))
    qtbot.addWidget(dialog)
    info = dialog.picker.info.text()
    assert "llama" in info and "134.5M parameters" in info and "30 layers" in info
    # The bundled Q4_1 file stays quantized, so on a CPU "auto" computes (and keeps KV) in
    # bfloat16: 2 x 30 layers x 3 KV heads x 64 x 2 bytes per token.
    prediction = dialog.picker.prediction.text()
    assert "Weights: Q4_1+Q8_0 kept as cpu-int4" in prediction
    assert "compute in bfloat16" in prediction
    assert "23,040 B" in prediction and "182 blocks of 16 = 2,912 tokens" in prediction
    dialog.quantization.setCurrentText("none")  # dequantized: float32, as before
    prediction = dialog.picker.prediction.text()
    assert "46,080 B" in prediction and "91 blocks of 16 = 1,456 tokens" in prediction
    assert "Weights: dequantized kept as dense" in prediction
    dialog.block_size.setCurrentText("32")
    dialog.kv_dtype.setCurrentText("float16")
    assert "91 blocks of 32 = 2,912 tokens" in dialog.picker.prediction.text()
    dialog.picker.source.setCurrentIndex(1)
    dialog.picker.path.setText("/no/such/model.gguf")
    dialog.picker.path.editingFinished.emit()
    assert "does not exist" in dialog.picker.error.text()
    assert dialog.result_settings().engine.model == "/no/such/model.gguf"
    assert dialog.result_settings().engine.block_size == 32


def test_applying_settings_rebuilds_the_engine_and_keeps_chats(make_window, qtbot, default_model):
    window = make_window(block_size=16)
    cid = window.new_conversation()
    window.store.add_message(cid, "user", "Keep me")
    assert window.engine_info.block_size == 16
    busy = []
    window.client.busy.connect(busy.append)
    with qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS) as ready:
        window.apply_settings(window.settings.with_engine(block_size=32))
    assert ready.args[0].block_size == 32
    assert busy == ["Rebuilding the engine…", ""]  # the busy bar's text, then idle
    qtbot.waitUntil(lambda: window.last_telemetry.stats["kv_block_size"] == 32, timeout=TIMEOUT_MS)
    assert window.client.worker._loaded is default_model  # tokenizer reused, not rebuilt
    assert window.engine_info.weight_format == "float32"
    assert "weights float32" in window.model_label.text()
    assert window.store.messages(cid)[0].content == "Keep me"
    assert "× 32" in window.model_label.text()


def test_a_bad_model_file_shows_an_error_and_the_app_keeps_working(make_window, qtbot, tmp_path):
    window = make_window(max_tokens=4)
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\x00" * 64)
    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT_MS) as shown:
        window.apply_settings(window.settings.with_engine(model=str(bad)))
    assert str(bad) in shown.args[0] or "GGUF" in shown.args[0] or "gguf" in shown.args[0]
    assert window._error_box is not None and window._error_box.isVisible()
    window._error_box.close()
    # Back on the previous model: settings say so, and a chat still works.
    assert window.settings.engine.model is None
    assert window.engine_info.model_source == default_model_source(window)
    with qtbot.waitSignal(window.reply_finished, timeout=TIMEOUT_MS) as done:
        cid = window.send_message("Say yes.")
    assert done.args == [cid, "complete"]

    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT_MS) as shown:
        window.apply_settings(window.settings.with_engine(model=str(tmp_path / "missing.gguf")))
    assert "does not exist" in shown.args[0]


def default_model_source(window):
    return window.client.worker._loaded.source
