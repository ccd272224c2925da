"""The app's settings: one object, persisted as JSON under the data dir (its dialog is
app/desktop/settings/dialog.py).

`AppSettings.engine` holds the knobs that need an engine rebuild, `sampling` the defaults for new
replies, `overflow_policy` what happens when a chat outgrows the context, `wanted_max_model_len`
the length the user chose when the dialog had to lower it to a model's context (so a model that
allows it gets it back, in a later dialog too, as the dialog's note promised). Loading validates
every value once; a bad file raises ValueError naming the key, and the window falls back to
defaults and says so.
"""

from __future__ import annotations

import json
import math
import reprlib
import typing
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from kvscope.app.core.defaults import DEFAULT_CPU_KV_MIB, DEFAULT_MAX_MODEL_LEN
from kvscope.engine.config import EngineConfig, user_knobs
from kvscope.engine.input_file import read_input_file

# The theme setting's choices (app/desktop/theme.py applies them).
THEMES = ("system", "light", "dark")

OVERFLOW_POLICIES = {
    "stop": "Stop with a message",
    "drop_oldest": "Drop the oldest turns (keep the system prompt)",
}
# The devices the dialog offers; EngineConfig also takes "cuda:N".
DEVICES = ("auto", "cpu", "cuda")
KV_BUDGET_HELP = (
    f"the KV pool's size on a CPU (default: {DEFAULT_CPU_KV_MIB:,} MiB, as `kvscope serve` and "
    "`record` size it); on CUDA, GPU memory utilization sizes it"
)


@dataclass
class EngineSettings:
    """Knobs whose change rebuilds the engine (the tokenizer is reused unless `model` changes;
    weights are read from the file again). A field named like an EngineConfig knob is that knob
    and reaches it by name; `kv_budget_mib` is the app's own (see engine_config). The names are
    also the keys of the settings file, so they stay."""

    model: str | None = None  # None: the bundled default; else a .gguf file or an HF folder
    device: str = "auto"
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    block_size: int = 16
    kv_budget_mib: int = DEFAULT_CPU_KV_MIB  # the KV pool on CPU
    gpu_memory_utilization: float = 0.9  # the KV budget on CUDA
    max_model_len: int | None = DEFAULT_MAX_MODEL_LEN  # None: the model's own context length
    max_num_seqs: int = 64
    enable_prefix_caching: bool = True
    allocator: str = "paged"
    quantization: str = "auto"  # auto: keep a GGUF's own; none; int8/int4 at load
    num_threads: int | None = None  # None: the engine's default (physical cores less one)

    def engine_config(self) -> EngineConfig:
        """The EngineConfig these settings build; raises ValueError on a bad knob."""
        shared = {f.name for f in fields(self)} & {f.name for f in user_knobs()}
        config = EngineConfig(**{name: getattr(self, name) for name in shared})
        if config.torch_device.type != "cpu":
            return config
        # A budget in MiB reads better than bytes in a dialog; on CUDA the pool is sized from
        # gpu_memory_utilization instead, so kv_budget_mib applies on a CPU only.
        return replace(config, kv_cache_memory=self.kv_budget_mib << 20)

    def llm_kwargs(self) -> dict:
        """Keyword arguments for `LLM(model=..., **kwargs)` that build `engine_config()`."""
        config = self.engine_config()
        return {f.name: getattr(config, f.name) for f in user_knobs() if f.name != "model"}


@dataclass
class SamplingSettings:
    temperature: float = 0.7
    top_p: float = 0.9
    top_k: int = -1
    max_tokens: int = 256
    seed: int | None = None
    n: int = 1
    min_p: float = 0.0
    repetition_penalty: float = 1.0

    @classmethod
    def from_dict(cls, data: object) -> SamplingSettings:
        """Validated settings from saved JSON (a chat's, the file's); unknown keys are ignored.
        Raises ValueError naming a bad value."""
        from kvscope.engine import SamplingParams

        settings = _dataclass_from(cls, data, "sampling")
        SamplingParams(**settings.params_kwargs())
        return settings

    def params_kwargs(self) -> dict:
        return asdict(self)


@dataclass
class AppSettings:
    engine: EngineSettings = field(default_factory=EngineSettings)
    sampling: SamplingSettings = field(default_factory=SamplingSettings)
    overflow_policy: str = "stop"
    theme: str = "system"  # one of THEMES
    # The user's max model length when it is over engine.max_model_len (lowered to fit the
    # model's context); None when nothing was lowered. Not an engine knob: no rebuild.
    wanted_max_model_len: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> AppSettings:
        """Validated settings; keys this version does not know are ignored (a newer app's)."""
        if not isinstance(data, dict):
            raise ValueError(f"settings must be a JSON object, got {type(data).__name__}")
        engine = _dataclass_from(EngineSettings, data.get("engine", {}), "engine")
        sampling = _dataclass_from(SamplingSettings, data.get("sampling", {}), "sampling")
        policy = data.get("overflow_policy", "stop")
        theme = data.get("theme", "system")
        wanted = data.get("wanted_max_model_len")
        settings = cls(
            engine=engine,
            sampling=sampling,
            overflow_policy=policy,
            theme=theme,
            wanted_max_model_len=wanted,
        )
        settings.validate()
        return settings

    def validate(self) -> None:
        from kvscope.engine import SamplingParams

        if self.overflow_policy not in OVERFLOW_POLICIES:
            raise ValueError(
                f"overflow_policy {self.overflow_policy!r} is not one of {tuple(OVERFLOW_POLICIES)}"
            )
        if self.theme not in THEMES:
            raise ValueError(f"theme {self.theme!r} is not one of {THEMES}")
        wanted = self.wanted_max_model_len
        if wanted is not None and (
            not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 1
        ):
            raise ValueError(f"wanted_max_model_len must be an int >= 1 or null, got {wanted!r}")
        if not isinstance(self.engine.kv_budget_mib, int) or self.engine.kv_budget_mib < 1:
            raise ValueError(
                f"kv_budget_mib must be an int >= 1, got {self.engine.kv_budget_mib!r}"
            )
        self.engine.engine_config()
        SamplingParams(**self.sampling.params_kwargs())

    def with_engine(self, **changes) -> AppSettings:
        return replace(self, engine=replace(self.engine, **changes))


def _dataclass_from(cls, data: object, name: str):
    """`cls` from a JSON object's known keys, each of its field's type (ints and floats finite
    and in range, strings short): what the engine's checks expect to be given."""
    if not isinstance(data, dict):
        raise ValueError(f"settings {name!r} must be a JSON object, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    return cls(
        **{
            f.name: _typed(f"{name}.{f.name}", data[f.name], hints[f.name])
            for f in fields(cls)
            if f.name in data
        }
    )


def _typed(where: str, value: object, hint: object) -> object:
    """`value` if it is of the field type `hint` (`int`, `float`, `str`, `bool`, or one of
    them or None); ValueError naming the key. A NaN or a 400-digit int is no setting."""
    kinds = typing.get_args(hint) or (hint,)
    number = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and abs(value) <= MAX_INT
        and math.isfinite(value)
    )
    for kind in kinds:
        if (
            (kind is type(None) and value is None)
            or (kind is bool and isinstance(value, bool))
            or (kind is int and number and isinstance(value, int))
            or (kind is float and number)
            or (kind is str and isinstance(value, str) and len(value) <= MAX_STRING_CHARS)
        ):
            return value
    names = " or ".join(
        "null" if k is type(None) else getattr(k, "__name__", str(k)) for k in kinds
    )
    raise ValueError(f"settings {where} must be {names}, got {reprlib.repr(value)}")


# The file holds a few dozen values (~1 KB); anything near this is not a settings file.
MAX_SETTINGS_BYTES = 1 << 20
MAX_MESSAGE_CHARS = 300  # of a value's complaint, in the window's note
MAX_INT = (1 << 63) - 1  # past every count, size and seed a setting holds
MAX_STRING_CHARS = 4096  # a model's path is the longest string


def settings_path() -> Path:
    from kvscope.app.core.paths import data_dir

    return data_dir() / "settings.json"


def load_settings(path: Path | None = None) -> AppSettings:
    """Saved settings, or defaults when none are saved; ValueError (naming the file) if bad."""
    path = path or settings_path()
    if not path.exists():
        return AppSettings()
    # A regular file of a settings file's size (a link to /dev/zero once read without end).
    data = read_input_file(path, "settings file", MAX_SETTINGS_BYTES)
    try:
        return AppSettings.from_dict(json.loads(data))
    except RecursionError:  # nested past the parser's depth: not a settings file either
        raise ValueError(f"{path}: JSON nested too deeply for a settings file") from None
    except (TypeError, ValueError) as e:  # json's errors (not UTF-8 too) are ValueErrors
        # A message quotes the bad value, which in a damaged file can run to megabytes.
        text = str(e) if len(str(e)) <= MAX_MESSAGE_CHARS else str(e)[:MAX_MESSAGE_CHARS] + "…"
        raise ValueError(f"{path}: {text}") from e


def save_settings(settings: AppSettings, path: Path | None = None) -> None:
    path = path or settings_path()
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(settings.to_dict(), indent=2))
    tmp.replace(path)  # atomic: a crash never leaves half a settings file
