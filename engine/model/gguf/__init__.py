"""GGUF files: the header read with checked sizes, a file's identity and summary, and the loader
that turns its tensors into our weights."""
