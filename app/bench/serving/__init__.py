"""`kvscope bench --serve`: concurrent streaming clients against `kvscope serve`, and the same
against llama.cpp's `llama-server`."""
