"""Where the checkout and its test helpers are, for tests at any depth of tests/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
