"""fastpoll's fallback application: the authority behind the poll cache."""

__version__ = "0.1.0"
