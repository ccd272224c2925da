"""The long drive's scenarios: what a user does in the window, one method each.

Each one drives the real widgets through `User` and returns the figures it saw (reply times
and lengths, rebuild times, counts); the drive records them with the scenario's duration.
State is read from the window (is a reply in flight, which model is loaded) only to know when
to go on, never to do what a widget does.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from monitors import ErrorWatch, RssSampler
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QDialogButtonBox
from user import DriveTimeout, User

from kvscope.app.desktop.recording.replay_view import ReplayDialog
from kvscope.app.desktop.settings.dialog import SettingsDialog

CHAT_PROMPTS = (
    "Give me three tips for keeping houseplants alive.",
    "What is the difference between a list and a tuple in Python?",
    "Summarise the plot of a heist movie in two sentences.",
    "Why is the sky blue? Answer briefly.",
)
CODE_PROMPT = "Write a Python function is_prime(n) in a code block, then explain it in one line."


@dataclass
class Sizes:
    """How big each step is: the hour's drive, or the smoke test's few seconds."""

    max_tokens: int = 64
    load_seconds: float = 30.0
    reply_timeout_s: float = 300.0
    rebuild_timeout_s: float = 900.0


class Scenarios:
    def __init__(
        self,
        window,
        user: User,
        errors: ErrorWatch,
        rss: RssSampler,
        out: Path,
        other_model: str | None,
        sizes: Sizes,
    ) -> None:
        self.w, self.user, self.errors, self.rss = window, user, errors, rss
        self.out, self.other_model, self.sizes = out, other_model, sizes
        self.ready_count = 0
        self.failed_count = 0
        self.events: list[dict] = []  # model switches, for the plot
        self._sent = 0
        self._typed_over: int | None = None  # the max length typed down for the other model
        window.engine_ready.connect(self._ready)
        window.engine_failed.connect(self._failed)

    def _ready(self, _info) -> None:
        self.ready_count += 1

    def _failed(self, _message) -> None:
        self.failed_count += 1

    def all(self, only: str | None = None) -> list[tuple[str, object]]:
        """The loop's scenarios in order; `only`: a comma-separated subset of their names."""
        order = [
            ("chat", self.chat),
            ("code question", self.code_question),
            ("switch model", self.switch_model),
            ("regenerate", self.regenerate),
            ("n=3", self.three_samples),
            ("search", self.search),
            ("export", self.export),
            ("load generator", self.load_generator),
            ("record and replay", self.record_and_replay),
            ("theme", self.switch_theme),
        ]
        chosen = {n.strip() for n in only.split(",")} if only else {n for n, _ in order}
        unknown = chosen - {n for n, _ in order}
        if unknown:
            raise ValueError(f"no scenario named {sorted(unknown)}: {[n for n, _ in order]}")
        keep = [(n, f) for n, f in order if n in chosen]
        return [(n, f) for n, f in keep if n != "switch model" or self.other_model]

    # ---- helpers ------------------------------------------------------------------------
    def _say(self, label: str) -> None:
        self.user.activity.set(label)

    def set_sampling(self, max_tokens: int | None = None, n: int | None = None) -> None:
        """Open the chat's sampling panel, type the values, close it again."""
        chat = self.w.chat
        self.user.click(chat.sampling_toggle, "Sampling")
        for spin, value in ((chat.sampling.max_tokens, max_tokens), (chat.sampling.n, n)):
            if value is not None and spin.value() != value:
                self.user.type_into(spin, str(value))
                self.user.key(spin, Qt.Key_Tab)
                if spin.value() != value:
                    raise DriveTimeout(f"typed {value} into a sampling box: {spin.value()}")
        self.user.click(chat.sampling_toggle, "Sampling")

    def new_chat(self) -> None:
        self.user.click(self.w.conversations.new_button, "+ New chat")
        self.set_sampling(max_tokens=self.sizes.max_tokens, n=1)

    def _wait_reply(self, what: str) -> dict:
        """Until the open chat's reply is stored; its figures from the stored message."""
        t0 = time.monotonic()
        self._say(f"{what}: waiting for the reply")
        self.user.wait_until(
            lambda: not self.w.chats.pending, self.sizes.reply_timeout_s, f"{what}: the reply"
        )
        cid = self.w.chats.current_id
        last = self.w.store.messages(cid)[-1] if cid is not None else None
        if last is None or last.role != "assistant":
            raise DriveTimeout(f"{what}: no reply was stored ({self.w.chat.notice.text()!r})")
        metrics = last.metrics or {}
        return {
            "wall_s": round(time.monotonic() - t0, 2),
            "status": last.status,
            "chars": len(last.content),
            "samples": len(last.alternatives or [last.content]),
            "ttft_s": metrics.get("ttft_s"),
            "tokens_per_s": metrics.get("tokens_per_s"),
            "tokens": metrics.get("generated_tokens"),
        }

    def send(self, text: str, what: str) -> dict:
        self._say(f"{what}: typing")
        composer = self.w.chat.composer
        self.user.type_into(composer, text)
        self._say(f"{what}: Enter")
        self.user.key(composer, Qt.Key_Return)
        if composer.toPlainText():
            raise DriveTimeout(f"{what}: the message stayed in the composer (not sent)")
        self._sent += 1
        return self._wait_reply(what)

    # ---- scenarios ----------------------------------------------------------------------
    def chat(self) -> dict:
        self.new_chat()
        first = self.send(CHAT_PROMPTS[self._sent % len(CHAT_PROMPTS)], "chat")
        second = self.send("Thanks. Can you say that more briefly?", "chat follow-up")
        return {"first": first, "follow_up": second}

    def code_question(self) -> dict:
        self.new_chat()
        reply = self.send(CODE_PROMPT, "code question")
        text = self.w.store.messages(self.w.chats.current_id)[-1].content
        return {**reply, "has_code_block": "```" in text}

    def regenerate(self) -> dict:
        bubbles = self.w.chat.bubbles()
        if not bubbles:
            self.chat()
            bubbles = self.w.chat.bubbles()
        before = self.w.store.messages(self.w.chats.current_id)[-1].content
        self._say("regenerate: click")
        self.user.click(bubbles[-1].regenerate, "Regenerate")
        reply = self._wait_reply("regenerate")
        after = self.w.store.messages(self.w.chats.current_id)[-1].content
        return {**reply, "changed": after != before}

    def three_samples(self) -> dict:
        self.new_chat()
        self.set_sampling(n=3)
        reply = self.send("Suggest a name for a pet turtle.", "n=3")
        bubble = self.w.chat.bubbles()[-1]
        shown = []
        if bubble.next_alt.isVisible():
            self.user.click(bubble.next_alt, "next sample")
            self.user.wait(0.2)
            bubble = self.w.chat.bubbles()[-1]  # the chat redraws on a switch
            shown.append(bubble.alt_label.text())
        self.set_sampling(n=1)
        return {**reply, "switched_to": shown}

    def search(self) -> dict:
        box = self.w.conversations.search
        self._say("search: typing")
        t0 = time.monotonic()
        self.user.type_into(box, "python")
        self.user.wait(0.3)
        found = self.w.conversations.list.count()
        self.user.type_into(box, "no such chat zzz")
        self.user.wait(0.3)
        hint = self.w.conversations.no_results.isVisible()
        self.user.type_into(box, "")
        self.user.wait(0.3)
        total = self.w.conversations.list.count()
        return {"python_matches": found, "no_match_hint_shown": hint, "all_chats": total,
                "wall_s": round(time.monotonic() - t0, 2)}  # fmt: skip

    def export(self) -> dict:
        target = self.out / "exports" / f"chat-{len(self.events)}-{time.monotonic_ns()}.md"
        target.parent.mkdir(parents=True, exist_ok=True)
        self._say("export: Chat ▸ Export chat as Markdown…")
        answer = self.user.answer_file_dialog(str(target))
        self.user.menu(self.w, "&Chat", "Export chat as Markdown…")
        self.user.wait_until(lambda: answer or None, 25, "export: the file dialog")
        if "error" in answer:
            raise DriveTimeout(f"export: {answer['error']}")
        self.user.wait_until(target.is_file, 10, f"export: {target}")
        return {"bytes": target.stat().st_size, "dialog_started_in": answer.get("directory")}

    def switch_model(self) -> dict:
        there = self._rebuild(self.other_model, "other")
        reply = self.send("Hello! Who are you?", "chat on the other model")
        back = self._rebuild(None, "bundled")
        return {"to_other": there, "reply_on_other": reply, "back": back}

    def _rebuild(self, model: str | None, label: str) -> dict:
        self._say(f"switch to {label}: Ctrl+, ")
        self.user.shortcut(self.w, Qt.Key_Comma, Qt.ControlModifier)
        dialog = self.user.wait_until(
            lambda: next((d for d in self.w.findChildren(SettingsDialog) if d.isVisible()), None),
            10,
            "the settings dialog",
        )
        source = dialog.picker.source
        max_len_at_open = dialog.max_len.value()
        wanted = 0 if model is None else 1  # Bundled, GGUF file
        for _ in range(4):
            if source.currentIndex() == wanted:
                break
            self.user.key(source, Qt.Key_Up if source.currentIndex() > wanted else Qt.Key_Down)
        if model is not None:
            self.user.type_into(dialog.picker.path, model)
            self.user.key(dialog.picker.path, Qt.Key_Tab)  # Enter would press Apply
        lengths = self._fit_context(dialog, max_len_at_open)
        self._say(f"switch to {label}: Apply")
        before_ready, before_failed = self.ready_count, self.failed_count
        rss_before = self.rss.sample(f"before switch to {label}")["rss_mib"]
        t0 = time.monotonic()
        self.user.click(dialog.findChild(QDialogButtonBox).button(QDialogButtonBox.Ok), "Apply")
        if dialog.isVisible():
            problem = dialog.error.text() or dialog.picker.error.text()
            dialog.reject()
            raise DriveTimeout(f"switch to {label}: the dialog refused Apply: {problem}")
        self._say(f"switch to {label}: rebuilding")
        self.user.wait_until(
            lambda: self.ready_count > before_ready or self.failed_count > before_failed,
            self.sizes.rebuild_timeout_s,
            f"switch to {label}: the rebuild",
        )
        seconds = time.monotonic() - t0
        if self.failed_count > before_failed:
            raise DriveTimeout(f"switch to {label}: the rebuild failed ({self.w.last_error})")
        self.rss.model = label
        self.user.wait(2)  # the first telemetry, the freed buffers
        rss_after = self.rss.sample(f"after switch to {label}")["rss_mib"]
        self.events.append({"t_s": round(self.user.activity.now(), 1), "to": label})
        return {"rebuild_s": round(seconds, 1), "rss_before_mib": rss_before,
                "rss_after_mib": rss_after, "model": self.w.engine_info.settings.model,
                **lengths}  # fmt: skip

    def _fit_context(self, dialog, before: int) -> dict:
        """As a user reading "Context length: 512 tokens": a max length over the chosen model's
        context is typed down to it (unless the dialog lowered it itself), and on the way back
        to the bundled model the length the user had is typed back in. Returns what the box
        showed, so the JSON says whether the dialog kept a lowered length."""
        box, config = dialog.max_len, dialog.picker.model_config()
        own = config.max_position_embeddings if config is not None else None
        seen = {"max_len_at_open": before, "max_len_after_choice": box.value()}
        if dialog.picker.source.currentIndex() != 0:
            if own is not None and (box.value() == 0 or box.value() > own):
                self.user.type_into(box, str(own))
                self.user.key(box, Qt.Key_Tab)
            if box.value() != before and self._typed_over is None:
                self._typed_over = before
        elif self._typed_over is not None:
            if box.value() != self._typed_over:
                self.user.type_into(box, str(self._typed_over))
                self.user.key(box, Qt.Key_Tab)
            self._typed_over = None
        seen["max_len_applied"] = box.value()
        return seen

    def load_generator(self) -> dict:
        column, panel = self.w.map_column, self.w.loadgen_panel
        if not column.loadgen_toggle.isChecked():
            self.user.click(column.loadgen_toggle, "Simulated users")
        self._say("load generator: Start")
        self.user.click(panel.start, "Start load")
        self._say("load generator: running")
        self.user.wait(self.sizes.load_seconds)
        running_line = panel.status.text()
        self._say("load generator: Stop")
        self.user.click(panel.stop, "Stop")
        self.user.wait_until(lambda: "stopped" in panel.status.text(), 120, "the load to stop")
        stats = self.w.last_telemetry.stats if self.w.last_telemetry else None
        self.user.click(column.loadgen_toggle, "Simulated users")
        return {"while_running": running_line, "after_stop": panel.status.text(),
                "preemptions": (stats or {}).get("num_preemptions")}  # fmt: skip

    def record_and_replay(self) -> dict:
        rec = self.w.recording
        self._say("record: ● Record")
        self.user.click(rec.button, "● Record")
        self.user.wait_until(lambda: rec.recording_path, 20, "the recording to start")
        self.new_chat()
        reply = self.send("Name three planets.", "chat while recording")
        self._say("record: ■ Stop recording")
        self.user.click(rec.button, "■ Stop recording")
        self.user.wait_until(lambda: not rec.recording_path and rec.last_recording, 20, "stop")
        path = rec.last_recording
        self._say("replay: Engine ▸ Open recording…")
        answer = self.user.answer_file_dialog(path)
        self.user.menu(self.w, "&Engine", "Open recording…")
        if "error" in answer:
            raise DriveTimeout(f"replay: {answer['error']}")
        dialog = self.user.wait_until(
            lambda: next(
                (d for d in QApplication.topLevelWidgets()
                 if isinstance(d, ReplayDialog) and d.isVisible()), None),
            20,
            "the replay dialog",
        )  # fmt: skip
        self._say("replay: reading")
        self.user.wait_until(lambda: dialog.loader.done, 120, "the recording to be read")
        self.user.wait(0.3)  # its poll puts the last steps on the slider
        self._say("replay: scrubbing")
        self.user.key(dialog.slider, Qt.Key_End)
        for _ in range(3):
            self.user.click(dialog.previous, "◀ Step")
        line = dialog.step_label.text()
        steps = dialog.num_steps()
        self.user.key(dialog, Qt.Key_Escape)
        self.user.wait_until(lambda: not dialog.isVisible(), 5, "the replay to close")
        return {"reply": reply, "steps": steps, "step_line": line,
                "file_bytes": Path(path).stat().st_size}  # fmt: skip

    def switch_theme(self, to: str | None = None) -> dict:
        to = to or ("light" if self.w.settings.theme != "light" else "dark")
        self._say(f"theme: View ▸ Theme ▸ {to}")
        self.user.menu(self.w, "&View", "Theme", to.capitalize())
        self.user.wait(0.3)
        if self.w.settings.theme != to:
            raise DriveTimeout(f"theme: asked for {to}, the window has {self.w.settings.theme}")
        return {"theme": to}
