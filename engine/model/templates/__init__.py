"""Chat templates: the fallback a model file without one gets, and rendering as transformers
renders them, within a time and size budget."""
