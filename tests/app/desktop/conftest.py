"""Fixtures of the desktop app's tests: the remote view over two fake replicas."""

from remote_views import two_replicas  # noqa: F401 (a fixture)
