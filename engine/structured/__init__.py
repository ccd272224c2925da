"""Constrained decoding: a request's grammar (JSON Schema, regex, choice, Lark) masks the logits
of every token it samples, so what comes out always parses."""
