"""Models: loading GGUF files and HF folders, the Llama-family forward (Gemma 3 beside it), the
sampler, chat templates and tokenizers."""
