"""Transports: each backend moves bytes point-to-point and offers its native collectives."""
from .base import Backend, Request

__all__ = ["Backend", "Request"]
