"""Getting models from the Hugging Face Hub: search, fit verdicts and resumable, verified pulls
into the standard Hugging Face cache. No Qt here: the CLI and the desktop both use it."""
