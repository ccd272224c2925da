"""llama.cpp as the CPU benches' peer: its build, its server, and the same GGUF run by both."""
