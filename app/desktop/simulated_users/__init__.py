"""Simulated users: a closed-loop load generator over the engine (pure logic, no Qt), the
machine's measured speed it sizes its load from, and the panel that starts it."""
