"""The settings dialog: the model, the engine knobs and the chat policy, checked before Apply."""
