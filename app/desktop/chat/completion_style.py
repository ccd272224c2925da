"""CompletionStyle: a base model's chats say what the model is and reply completion-style.

A GGUF without a chat template whose names say nothing of instruct, chat or "it" is taken for
a base model (engine/model/templates/fallbacks.py): the engine gives it a plain "User: … /
Assistant:" transcript instead of an instruct turn format, and EngineInfo.base_model says so.
A base model continues text rather than answering, so a chat on it (on this engine, not on a
server) shows a notice saying that, and its replies get completion-style defaults: they stop
at the next "User:" line the model writes, and a repetition penalty of 1.1 where the chat's is
the neutral 1.0 (a base model loops on its own text). The chat's own settings are not changed.

The chat controller owns one, tells it of every engine it gets, and asks it for each reply's
parameters; BackendChoice asks it for its notice.
"""

from __future__ import annotations

from kvscope.app.desktop.chat.store import Conversation
from kvscope.engine.model.templates.fallbacks import COMPLETION_STOP

BASE_REPETITION_PENALTY = 1.1
BASE_MODEL_NOTICE = (
    "This looks like a base model: it continues text rather than answering. Replies use a "
    "plain “User: / Assistant:” transcript, stop at the next “User:” line and use repetition "
    f"penalty {BASE_REPETITION_PENALTY} where yours is 1.0. For answers, pick an instruct build "
    "(-it, -Instruct, -Chat)."
)


def completion_params(params: dict) -> dict:
    """A reply's sampling parameters with the base-model defaults added (a copy)."""
    params = dict(params)
    stops = params.get("stop") or []
    stops = [stops] if isinstance(stops, str) else list(stops)
    params["stop"] = stops + [s for s in COMPLETION_STOP if s not in stops]
    if params.get("repetition_penalty", 1.0) == 1.0:
        params["repetition_penalty"] = BASE_REPETITION_PENALTY
    return params


class CompletionStyle:
    def __init__(self, engine_client: object) -> None:
        """`engine_client`: the backend that is this engine (a chat on a server is not styled)."""
        self._engine_client = engine_client
        self.base_model = False  # the engine's model, from its last EngineInfo

    def engine_changed(self, info) -> None:
        """A (re)built engine: its model may be a base model now, or no longer."""
        self.base_model = bool(getattr(info, "base_model", False))

    def applies(self, conv: Conversation | None, backend: object) -> bool:
        """Whether this chat, answered by `backend`, talks to a base model on this engine."""
        return self.base_model and conv is not None and backend is self._engine_client

    def reply_params(self, conv: Conversation, backend: object, params: dict) -> dict:
        """The chat's sampling parameters, completion-style for a base model on this engine."""
        return completion_params(params) if self.applies(conv, backend) else params

    def notice_for(self, conv: Conversation | None, backend: object) -> str:
        """What the chat says of its model; "" when it is not a base model on this engine."""
        return BASE_MODEL_NOTICE if self.applies(conv, backend) else ""
