"""Function calling: OpenAI's `tools` and `tool_choice`, rendered into the prompt, enforced by a
grammar on the output, and parsed back into `tool_calls`."""
