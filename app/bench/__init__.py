"""`kvscope bench`: the engine's speed against HF transformers, measured in the same run."""
