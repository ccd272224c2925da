"""The one error a load raises when the model does not fit the memory that is free.

Its own module, below the weight plan and the loaders that both raise it: an exception type is
no reason for one of them to import the other.
"""

from __future__ import annotations


class ModelTooLargeError(ValueError):
    """The model cannot be loaded into the memory that is free; says what would help."""
