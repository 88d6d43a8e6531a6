"""Where a Spark Connect server listens: ``sc://host:port`` parsed, and whether it answers.

Shared by the session builder (``warehouse.spark``, the client side) and the server runner
(``warehouse.connect_server``).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 15002


@dataclass(frozen=True)
class RemoteAddress:
    """Where a Spark Connect server listens, parsed from ``sc://host:port``."""

    host: str
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6 literal
        return f"sc://{host}:{self.port}"


def parse_remote(url: str) -> RemoteAddress:
    """``sc://host[:port][/;params]`` -> its address; ValueError naming what is wrong.

    The port defaults to Spark Connect's 15002, as in pyspark's own client.
    """
    parts = urlsplit(url)
    if parts.scheme != "sc":
        raise ValueError(f"expected a Spark Connect URL sc://host:port, got {url!r}")
    try:
        port = parts.port
    except ValueError as e:
        raise ValueError(f"expected a port number in {url!r}: {e}") from e
    if not parts.hostname:
        raise ValueError(f"expected a host in the Spark Connect URL {url!r}")
    return RemoteAddress(parts.hostname, DEFAULT_PORT if port is None else port)


def port_answers(address: RemoteAddress, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections at ``address``."""
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            return True
    except OSError:
        return False
