"""The model picker: the bundled model, GGUF files and HF folders, the GGUFs LM Studio and
Ollama keep, and what each costs before it is loaded."""
