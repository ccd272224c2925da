"""CompletionStyle: a base model's chats say what the model is and reply completion-style.

A GGUF without a chat template whose names say nothing of instruct, chat or "it" is taken for
a base model (engine/model/templates/fallbacks.py): the engine gives it a plain "User: … /
Assistant:" transcript instead of an instruct turn format, and EngineInfo.base_model says so.
A base model continues text rather than answering, so a chat on it (on this engine, not on a
server) shows a notice saying that, and its replies get completion-style defaults: they stop
at the next "User:" line the model writes, and a repetition penalty of 1.1 where the chat's is
the neutral 1.0 (a base model loops on its own text). The chat's own settings are not changed.

A part of ChatController (app/desktop/chat/controller.py), mixed in over ChatBackendChoice,
whose notice it extends; it reads the controller's client, chat view, store and backends.
"""

from __future__ import annotations

from kvscope.app.desktop.chat.backend_choice import ChatBackendChoice
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


class CompletionStyle(ChatBackendChoice):
    """Mixed into ChatController: ChatBackendChoice and, over its notice, this one's."""

    base_model = False  # the engine's model, from its last EngineInfo

    def _engine_changed(self, info) -> None:
        """A (re)built engine: its model may be a base model now, or no longer."""
        self.base_model = bool(getattr(info, "base_model", False))
        if self.current_id is not None:
            self._refresh_backend_notice()

    def reply_params(self, conv: Conversation, backend: object) -> dict:
        """The chat's sampling parameters, completion-style for a base model on this engine."""
        params = self.sampling_of(conv).params_kwargs()
        return completion_params(params) if self._on_base_model(conv, backend) else params

    def _on_base_model(self, conv: Conversation | None, backend: object) -> bool:
        return self.base_model and conv is not None and backend is self.client

    def _show_backend_state(self, conv: Conversation | None) -> None:
        super()._show_backend_state(conv)
        if not self._backend_notice and conv is not None:
            if self._on_base_model(conv, self.backends.for_chat(conv)):
                self._backend_notice = BASE_MODEL_NOTICE
                self.chat.show_notice(BASE_MODEL_NOTICE)
