"""The engine's thread: the worker that owns the engine in its QThread, the engine it builds,
and the client the GUI thread holds."""
