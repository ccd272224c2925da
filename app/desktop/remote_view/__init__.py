"""The remote view: what connected servers' KV caches hold (app/remote/ feeds it).

The window puts `RemoteView(window.connections)` in a tab beside the local block map and calls
`add_connect_action(window, window.connections)` for Engine ▸ Connect…"""

from kvscope.app.desktop.remote_view.connect_dialog import ConnectDialog, add_connect_action
from kvscope.app.desktop.remote_view.view import RemoteView

__all__ = ["ConnectDialog", "RemoteView", "add_connect_action"]
