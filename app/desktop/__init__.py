"""The desktop app: the Qt window and its widgets (chat view, block map, load generator, status
bar, settings dialog, model picker, remote view, recording and replay, "Serve the engine"), and
the worker thread that owns the engine for it. It may import app.core, and the products it shows
or starts: app.remote (remote servers it chats with and follows) and app.serve (Engine ▸ Serve
the engine). Nothing but the command line's entry point imports it."""
