"""The "Get a model…" window: search the Hugging Face Hub for GGUF models, see what fits this
machine before downloading, download several at once (pause, resume, cancel), open the result.

The hub work is app/core/hub/ (search, fit verdicts, resumable verified pulls); this package is
its desktop face: every request and download runs off the GUI thread and reports back through
Qt signals. controls.py wires it into the main window (Engine ▸ Get a model…, the model picker's
button, the first-run offer in an empty chat while the bundled model runs).
"""
