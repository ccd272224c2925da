"""Sizing: what a model's weights and KV cache will take, what fits the memory that is free, how
many blocks the pool gets, and the model built only when it fits."""
