"""An agent framework, unmodified, in a venv of its own (`make client-venv`): pydantic-ai's
typed agents against `kvscope serve` on the bundled model. Its output types and tools travel
as OpenAI tools with tool_choice "required"; the grammar makes every call one it can read."""

import json
import subprocess

import pytest
from repo_paths import REPO, TESTS
from served import start_server

CLIENT_PYTHON = REPO / ".cache" / "clients" / "venv" / "bin" / "python"
SCRIPT = TESTS / "pydantic_ai_agent.py"  # run by the clients' venv, not collected


@pytest.fixture(scope="module")
def server(default_model):
    srv = start_server(default_model, 256, 2048)
    yield srv
    srv.stop()


def test_pydantic_ai_typed_agent_with_a_tool(server):
    if not CLIENT_PYTHON.exists():
        pytest.fail(f"{CLIENT_PYTHON} is missing: `make client-venv` builds it (make test does)")
    done = subprocess.run(
        [str(CLIENT_PYTHON), str(SCRIPT), f"{server.base_url}/v1", server.model_name],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["city"]["name"] and result["city"]["country"]
    assert result["calls"] and all(isinstance(c, str) and c for c in result["calls"])
    if result["forecast"] is not None:
        assert set(result["forecast"]) == {"city", "summary"}
