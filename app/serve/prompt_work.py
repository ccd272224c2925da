"""Where a request's prompt is prepared: chat templating and tokenizing, never on the event
loop (every client, /health included, would wait on it) nor in the engine thread (every
running stream would stall). Two small pools, shared by every server in the process, so a
flood queues instead of spawning threads, and a model whose template loops (each render
stopped at its 2 s budget) cannot hold up completions that only need tokenizing."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

TEMPLATE_WORKERS = 2
TOKENIZE_WORKERS = 2  # the Rust tokenizer releases the GIL: these run beside the engine

_templates = ThreadPoolExecutor(TEMPLATE_WORKERS, thread_name_prefix="kvscope-template")
_tokenizing = ThreadPoolExecutor(TOKENIZE_WORKERS, thread_name_prefix="kvscope-tokenize")


async def render_off_loop(fn: Callable[..., T], *args) -> T:
    """fn(*args) (a chat template render) in the template pool; its result or its exception."""
    return await asyncio.get_running_loop().run_in_executor(_templates, fn, *args)


async def tokenize_off_loop(fn: Callable[..., T], *args) -> T:
    """fn(*args) (a tokenizer call) in the tokenizing pool; its result or its exception."""
    return await asyncio.get_running_loop().run_in_executor(_tokenizing, fn, *args)
