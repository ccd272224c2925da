"""SchemaChecks: whether the engine can use a chat's JSON Schema, answered off both busy threads.

The chat's structured-output editor asks as the user types. Compiling goes to a thread of its
own: the first compile for a model wraps its vocabulary (~0.3-1.5 s), which would stall the GUI
thread, or every reply in flight on the engine's. The engine's GrammarCompiler may be called from
any thread and caches what it compiles, so the reply that uses the schema finds it ready. Checks
run one at a time, in order; the GUI drops answers about a text it no longer shows.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


class SchemaChecks:
    def __init__(self, answer: Callable[[int, object], None]) -> None:
        """`answer(ticket, error)`: "" (it compiles), why it does not, or None (no engine to
        ask); called on the checking thread (a queued signal's emit)."""
        self._answer = answer
        self._pool: ThreadPoolExecutor | None = None

    def check(self, grammars: Any, ticket: int, schema: Any) -> None:
        """Compile `schema` with `grammars` (the engine's GrammarCompiler; None: no engine)."""
        if grammars is None:
            self._answer(ticket, None)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="kvscope-schema-check")
        self._pool.submit(self._compile, grammars, ticket, schema)

    def shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None

    def _compile(self, grammars: Any, ticket: int, schema: Any) -> None:
        from kvscope.engine import StructuredOutputsParams

        try:
            grammars.compile(StructuredOutputsParams(json=schema))
        except ValueError as e:  # GrammarError and the params' own checks: the user's to fix
            self._answer(ticket, str(e))
        except Exception as e:  # the answer must come, or the editor would wait on it forever
            self._answer(ticket, f"{type(e).__name__}: {e}")
        else:
            self._answer(ticket, "")
