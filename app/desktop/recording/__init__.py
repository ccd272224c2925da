"""Recordings: the Record / Open controls and the replay of a recorded session on the block maps."""
