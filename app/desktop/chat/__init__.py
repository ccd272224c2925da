"""The chat side of the window: the SQLite store, the conversation list, the message view."""
