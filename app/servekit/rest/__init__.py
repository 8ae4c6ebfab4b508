"""HTTP adapter: the Litestar application over the DataPlane."""

from servekit.rest.app import create_app

__all__ = ["create_app"]
