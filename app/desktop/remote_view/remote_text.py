"""The text of a run of remote blocks, from the server that holds them: POST /detokenize
(vLLM's, at the server root; `kvscope serve` has it too). The remote view asks only for the
selected branch, in a worker thread; without an answer it keeps showing token ids."""

from __future__ import annotations

import httpx

from kvscope.app.remote.connection import Connection

TIMEOUT_S = 5.0


def detokenize_over_http(connection: Connection, model: str | None, tokens) -> str:
    headers = {"Authorization": f"Bearer {connection.api_key}"} if connection.api_key else {}
    body: dict = {"tokens": list(tokens)}
    if model:
        body["model"] = model
    response = httpx.post(
        f"{connection.url}/detokenize", json=body, headers=headers, timeout=TIMEOUT_S
    )
    response.raise_for_status()
    text = response.json().get("prompt")
    if not isinstance(text, str):
        raise ValueError(f"{connection.label}: /detokenize answered without a prompt")
    return text
