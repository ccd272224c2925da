"""The command line, `kvscope`: argument parsing (main), the terminal commands (chat, complete)
and `kvscope record`. The entry point: it may import every product (desktop, serve, remote,
bench) and app.core, and nothing in app/ imports it. `python -m kvscope.app.cli` runs main."""
