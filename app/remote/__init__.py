"""Remote servers: OpenAI-compatible endpoints (vLLM, SGLang, `kvscope serve`) the app chats
against, and whose KV caches it follows from their KV events and /metrics. Nothing here imports
Qt except the modules named *_qt; the GUI reads snapshots."""
