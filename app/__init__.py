"""KVScope's desktop app and command line (the only layer that knows about Qt)."""
