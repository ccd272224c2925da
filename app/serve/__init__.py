"""`kvscope serve`: an OpenAI-compatible HTTP server over the engine, with vLLM-named Prometheus
metrics and vLLM's KV-event wire format over ZMQ. Local and closed by default: it binds
127.0.0.1, and an API key (--api-key / KVSCOPE_API_KEY) guards every endpoint but /health."""
