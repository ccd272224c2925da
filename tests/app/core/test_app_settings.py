"""Settings: persisted JSON, the dialog and model picker, engine rebuilds, bad models."""

import json
from dataclasses import replace

import pytest

from kvscope.app.core.settings import (
    DEFAULT_CPU_KV_MIB,
    DEFAULT_MAX_MODEL_LEN,
    AppSettings,
    EngineSettings,
    load_settings,
    save_settings,
)
from kvscope.app.desktop.settings.dialog import SettingsDialog

TIMEOUT_MS = 120_000


def test_settings_round_trip_and_defaults(tmp_path):
    path = tmp_path / "settings.json"
    assert load_settings(path) == AppSettings()  # nothing saved yet
    assert AppSettings().engine.kv_budget_mib == DEFAULT_CPU_KV_MIB == 1024
    assert AppSettings().engine.max_model_len == DEFAULT_MAX_MODEL_LEN == 4096
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


# Engine knobs the app does not keep, and why.
NOT_IN_SETTINGS = {
    "kv_cache_memory",  # set from kv_budget_mib on a CPU (MiB read better in a dialog)
    "num_kv_blocks",  # the pool is sized from the memory budget instead
    "max_num_batched_tokens",  # the engine's per-device default suits a chat
    "seed",  # each reply's sampling seed is a sampling setting
    "cpu_quant_kernel",  # the app picks it: torch's while numba compiles (kernel_switch.py)
}
# Knobs whose app default differs from the engine's, and why.
APP_DEFAULTS = {
    "max_model_len": DEFAULT_MAX_MODEL_LEN,  # the default pool holds several full contexts
}
# A settings file as this version writes it: its keys are what files on users' disks hold.
SAVED_FILE = {
    "engine": {
        "model": None,
        "device": "auto",
        "dtype": "auto",
        "kv_cache_dtype": "auto",
        "block_size": 16,
        "kv_budget_mib": 1024,
        "gpu_memory_utilization": 0.9,
        "max_model_len": 4096,
        "max_num_seqs": 64,
        "enable_prefix_caching": True,
        "allocator": "paged",
        "quantization": "auto",
        "num_threads": None,
    },
    "sampling": {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": -1,
        "max_tokens": 256,
        "seed": None,
        "n": 1,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
    },
    "overflow_policy": "stop",
    "theme": "system",
    "wanted_max_model_len": None,
}


def test_every_engine_knob_is_a_setting_with_its_default_or_listed_as_not_one():
    from dataclasses import fields

    from kvscope.engine.config import user_knobs

    settings = {f.name: f.default for f in fields(EngineSettings)}
    for knob in user_knobs():
        assert (knob.name in settings) != (knob.name in NOT_IN_SETTINGS), knob.name
        if knob.name in settings:
            assert settings[knob.name] == APP_DEFAULTS.get(knob.name, knob.default), knob.name


def test_a_saved_settings_file_keeps_its_keys(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps(SAVED_FILE))
    assert load_settings(path) == AppSettings()
    assert AppSettings().to_dict() == SAVED_FILE


def test_a_file_from_before_min_p_loads_with_min_p_and_the_penalty_off(tmp_path):
    path = tmp_path / "settings.json"
    older = {**SAVED_FILE, "sampling": {"temperature": 0.3, "top_p": 0.8, "n": 2}}
    path.write_text(json.dumps(older))
    sampling = load_settings(path).sampling
    assert (sampling.temperature, sampling.n) == (0.3, 2)
    assert (sampling.min_p, sampling.repetition_penalty) == (0.0, 1.0)
    kwargs = sampling.params_kwargs()
    assert kwargs["min_p"] == 0.0 and kwargs["repetition_penalty"] == 1.0


# Every engine setting away from its default.
CUSTOM_ENGINE = EngineSettings(
    model="/models/other.gguf",
    device="cpu",
    dtype="bfloat16",
    kv_cache_dtype="float16",
    block_size=64,
    kv_budget_mib=48,
    gpu_memory_utilization=0.55,
    max_model_len=1024,
    max_num_seqs=5,
    enable_prefix_caching=False,
    allocator="contiguous",
    quantization="int8",
    num_threads=1,
)


def test_llm_kwargs_build_the_settings_engine_config():
    from kvscope.engine import EngineConfig

    settings = CUSTOM_ENGINE
    config = settings.engine_config()
    assert EngineConfig(model=settings.model, **settings.llm_kwargs()) == config
    assert config.kv_cache_memory == 48 << 20  # the CPU budget, in bytes
    for name, value in vars(settings).items():
        if name != "kv_budget_mib":
            assert getattr(config, name) == value, name
    with pytest.raises(ValueError, match="allocator 'buddy'"):
        EngineSettings(allocator="buddy").llm_kwargs()


def test_dialog_shows_each_setting_and_gives_it_back(qtbot):
    from kvscope.engine.config import knob_of

    engine = replace(CUSTOM_ENGINE, model=None)  # the picker would say the file is missing
    dialog = SettingsDialog(AppSettings(engine=engine))
    qtbot.addWidget(dialog)
    assert dialog.engine_settings() == engine
    block_sizes = [dialog.block_size.itemText(i) for i in range(dialog.block_size.count())]
    assert block_sizes == [str(b) for b in knob_of("block_size").choices]
    assert knob_of("allocator").help in dialog.allocator.toolTip()
    dialog.max_len.setValue(0)  # shown as "model's own"
    assert dialog.engine_settings().max_model_len is None


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
    assert "dequantized once" not in prediction  # "none" was the user's choice: nothing to say
    # float32 over the quantized file: dequantized once at load (it fits), and said so.
    dialog.quantization.setCurrentText("auto")
    dialog.dtype.setCurrentText("float32")
    prediction = dialog.picker.prediction.text()
    assert "kept as dense" in prediction and "dequantized once at load" in prediction
    dialog.dtype.setCurrentText("auto")
    dialog.quantization.setCurrentText("none")
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
    cid = window.chats.new_conversation()
    window.store.add_message(cid, "user", "Keep me")
    assert window.engine_info.block_size == 16
    busy = []
    window.client.busy.connect(busy.append)
    with qtbot.waitSignal(window.engine_ready, timeout=TIMEOUT_MS) as ready:
        window.apply_settings(window.settings.with_engine(block_size=32))
    assert ready.args[0].block_size == 32
    # The busy bar's texts (the weights' stage fills the bar as they are read), then idle.
    assert busy == ["Rebuilding the engine…", "Loading the weights…", ""]
    qtbot.waitUntil(lambda: window.last_telemetry.stats["kv_block_size"] == 32, timeout=TIMEOUT_MS)
    assert window.client.worker.builder.loaded is default_model  # tokenizer reused, not rebuilt
    assert window.engine_info.weight_format == "float32"
    assert "weights float32" in window.status.model_label.text()
    assert window.store.messages(cid)[0].content == "Keep me"
    assert "× 32" in window.status.model_label.text()


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
    with qtbot.waitSignal(window.chats.reply_finished, timeout=TIMEOUT_MS) as done:
        cid = window.chats.send_message("Say yes.")
    assert done.args == [cid, "complete"]

    with qtbot.waitSignal(window.error_shown, timeout=TIMEOUT_MS) as shown:
        window.apply_settings(window.settings.with_engine(model=str(tmp_path / "missing.gguf")))
    assert "does not exist" in shown.args[0]


def default_model_source(window):
    return window.client.worker.builder.loaded.source


def test_the_model_picker_lists_gguf_files_found_on_this_computer(qtbot, tmp_path, monkeypatch):
    from tiny_models import make_quant_gguf

    from kvscope.app.desktop.models.discovery import remember_model
    from kvscope.app.desktop.models.found_models import format_size

    models = tmp_path / "home" / ".lmstudio" / "models" / "someone" / "Tiny-GGUF"
    models.mkdir(parents=True)
    found = make_quant_gguf(models / "tiny-q8.gguf", "Q8_0")
    (models / "broken.gguf").write_bytes(b"GGUF" + b"\xff" * 40)
    (tmp_path / "home" / ".ollama" / "models" / "blobs").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KVSCOPE_DATA_DIR", str(tmp_path / "data"))
    opened = make_quant_gguf(tmp_path / "opened-before.gguf", "Q4_0")
    remember_model(tmp_path / "data", opened)
    dialog = SettingsDialog(AppSettings(engine=EngineSettings(device="cpu", kv_budget_mib=64)))
    qtbot.addWidget(dialog)
    listing = dialog.picker.found
    qtbot.waitUntil(lambda: listing.scan_done, timeout=TIMEOUT_MS)
    assert listing.paths() == [str(opened), str(models / "broken.gguf"), str(found)]
    rows = [[listing.tree.topLevelItem(i).text(c) for c in range(4)] for i in range(3)]
    assert rows[0][2:] == ["Q4_0", "Recent"]
    assert rows[1][2] == "unreadable" and rows[1][3] == "LM Studio"
    assert rows[2][1:] == [format_size(found.stat().st_size), "Q8_0", "LM Studio"]
    assert format_size(3 * 2**30) == "3.00 GiB" and format_size(1536) == "2 KiB"
    assert "3 found" in listing.status.text() and "Ollama folders" in listing.status.text()
    dialog.resize(900, 760)
    dialog.show()
    dialog.grab().save(str(tmp_path / "model-picker.png"))
    listing.tree.itemClicked.emit(listing.tree.topLevelItem(2), 0)
    assert dialog.picker.source.currentIndex() == 1
    assert dialog.result_settings().engine.model == str(found)
    assert "2 layers" in dialog.picker.info.text() and not dialog.picker.error.text()
