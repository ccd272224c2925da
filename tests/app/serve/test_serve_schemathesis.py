"""schemathesis against `kvscope serve`'s own OpenAPI schema, on a real socket (issue 27).

The server builds its app with openapi_url=None, so users never get a schema page; the test
takes the schema from `app.openapi()`, what FastAPI derives from the routes and pydantic bodies,
and runs schemathesis' CLI (its coverage phase of boundary values, then random fuzzing, valid and
invalid bodies) against a keyed server. Checks: no 5xx (not_a_server_error), and answers, their
content types and headers conform where the schema declares them. Not checked: status codes
(the server answers 400 with OpenAI's error body where FastAPI documents 422) and schemathesis'
acceptance checks (pydantic's lax mode takes "16" for 16, as vLLM does).

Cheap by construction: a tiny random model (2 layers, hidden 64) with max_model_len 256 and 4
sequences at a time, so no generated max_tokens or n can make a request run long; a bounded
number of examples per operation."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tiny_models import make_tiny_gguf

API_KEY = "schemathesis-key"
MAX_EXAMPLES = 30  # per operation and phase: ~900 cases in all, ~20 s on a quiet 2-core machine
RUN_TIMEOUT_S = 240  # a hang, not a speed bound
CHECKS = (
    "not_a_server_error",
    "response_schema_conformance",
    "content_type_conformance",
    "response_headers_conformance",
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from kvscope.app.serve.server import Server
    from kvscope.engine import LLM

    path, _ = make_tiny_gguf("llama", tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    llm = LLM(
        model=str(path),
        device="cpu",
        dtype="float32",
        num_kv_blocks=64,
        block_size=16,
        max_model_len=256,
        max_num_seqs=4,
    )
    srv = Server(llm, port=0, api_key=API_KEY).start()
    yield srv
    srv.stop()


def schema_for_generation(app, model_name: str) -> dict:
    """The app's OpenAPI schema, with two corrections so that generation reaches the engine and
    conformance judges what the routes really declare:
    - `model` is the served name (or null where optional): a random name stops every request at
      the 404; invalid bodies still send other values;
    - routes that return a Response of their own say so: FastAPI documents every route as JSON
      by default, but /health answers an empty body, /metrics Prometheus text, and the two
      completion routes stream SSE when asked."""
    schema = copy.deepcopy(app.openapi())
    for body in schema["components"]["schemas"].values():
        model = body.get("properties", {}).get("model")
        if model is None:
            continue
        served = {"type": "string", "enum": [model_name]}
        nullable = any(alt.get("type") == "null" for alt in model.get("anyOf", []))
        body["properties"]["model"] = {"anyOf": [served, {"type": "null"}]} if nullable else served
    paths = schema["paths"]
    paths["/health"]["get"]["responses"]["200"] = {"description": "the server is up"}
    paths["/metrics"]["get"]["responses"]["200"] = {
        "description": "Prometheus text",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
    # Schemathesis checks each server-sent event, as an object of its fields, against this.
    event = {"type": "object", "properties": {"data": {"type": "string"}}, "required": ["data"]}
    for route in ("/v1/chat/completions", "/v1/completions"):
        content = paths[route]["post"]["responses"]["200"]["content"]
        content["text/event-stream"] = {"schema": event}
    return schema


def run_schemathesis(
    schema_path: Path, base_url: str, workdir: Path
) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).parent / "schemathesis"
    command = [str(cli)] if cli.exists() else [sys.executable, "-m", "schemathesis.cli"]
    command += [
        "run",
        str(schema_path),
        "--url",
        base_url,
        "--header",
        f"Authorization: Bearer {API_KEY}",
        "--checks",
        ",".join(CHECKS),
        "--phases",
        "coverage,fuzzing",
        "--max-examples",
        str(MAX_EXAMPLES),
        "--workers",
        "1",
        "--request-timeout",
        "60",
        "--no-color",
    ]
    # In the test's own folder: whatever the run keeps (hypothesis' database) stays out of the tree.
    return subprocess.run(
        command, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, cwd=workdir
    )


def test_generated_requests_get_no_5xx_and_conform_to_the_schema(server, tmp_path):
    schema_path = tmp_path / "openapi.json"
    schema_path.write_text(json.dumps(schema_for_generation(server.app, server.model_name)))
    started = time.monotonic()
    result = run_schemathesis(schema_path, server.base_url, tmp_path)
    elapsed = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-20_000:]
    counted = re.search(r"(\d+) generated, (\d+) passed", output)
    assert counted, output[-5_000:]
    generated, passed = map(int, counted.groups())
    # Every operation ran, each with a sizeable number of cases (not a vacuous pass).
    assert generated == passed and generated >= 7 * MAX_EXAMPLES, output[-5_000:]
    print(f"schemathesis: {generated} cases in {elapsed:.1f} s, no failures")

    # What it sent left nothing behind, and the server still serves.
    stats = server.driver.call(lambda engine: engine.stats()).result(timeout=30)
    assert stats["num_running"] == stats["num_waiting"] == 0
    assert stats["kv_blocks_used"] == 0
    headers = {"Authorization": f"Bearer {API_KEY}"}
    body = {"model": server.model_name, "prompt": "hi", "max_tokens": 4}
    reply = httpx.post(f"{server.base_url}/v1/completions", json=body, headers=headers, timeout=30)
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1
