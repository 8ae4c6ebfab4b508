"""Where the server listens: ``server.host`` resolved to addresses, HTTP sockets bound, URLs named.

The start-up line (``servekit: listening ...``) is what users and scripts believe about the
server's exposure, so it must name exactly the addresses bound. A host name can stand for several
addresses (``localhost`` -> 127.0.0.1 and ::1): every one is bound, on the same port, by HTTP here
and by gRPC (which is handed this same list, never the name, so both listeners agree). Sockets are
bound here rather than by uvicorn so a port 0 is resolved before anything is printed.

``::`` is bound dual-stack (IPv4 too), as ``server.host``'s documentation promises for "every
interface"; other IPv6 sockets are IPv6-only so they never collide with an IPv4 socket of the same
port. grpcio always binds a wildcard dual-stack, so ``0.0.0.0`` also reaches gRPC over IPv6.
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from dataclasses import dataclass

log = logging.getLogger("servekit")

WILDCARD_CLIENT = {"0.0.0.0": "127.0.0.1", "::": "::1"}
"""Where a client on this machine reaches a wildcard bind."""
PORT_ATTEMPTS = 8
"""Tries at a free port shared by several addresses (one may already use the port picked)."""
BACKLOG = 2048


def resolve_host(host: str) -> tuple[list[str], bool]:
    """The IP addresses ``host`` stands for (IPv4 first, each once), and whether it was a name.

    An IP literal (brackets allowed) is itself; a name is resolved by the system resolver.
    """
    name = host.strip()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name:
        raise OSError("server.host is empty: give an address (127.0.0.1, 0.0.0.0, ::) or a name")
    try:
        return [str(ipaddress.ip_address(name))], False
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host!r}: {exc.strerror}") from None
    found: list[str] = []
    for family, _, _, _, sockaddr in infos:
        if family in (socket.AF_INET, socket.AF_INET6) and sockaddr[0] not in found:
            found.append(str(sockaddr[0]))
    if not found:
        raise OSError(f"cannot listen on {host!r}: it resolves to no IP address")
    found.sort(key=lambda address: ":" in address)  # stable: IPv4 first, resolver order kept
    return found, True


def bind_http(
    host: str, port: int, *, reuse_port: bool = False, listen: bool = True
) -> list[socket.socket]:
    """Listening sockets on every address of ``host``, all on one port (0: a free one).

    ``reuse_port`` sets SO_REUSEPORT (the workers of ``server.workers`` each listen on the
    port); ``listen=False`` only binds, which reserves the port without taking connections
    (the supervisor of the workers learns a port 0 that way).

    With port 0 the first address picks the port and the others take the same one; if another
    process holds it there, all are closed and a new port is tried. For a host *name*, an
    address the machine cannot bind (``::1`` where IPv6 is off) is skipped with a warning, as
    long as one address remains; a literal address that cannot be bound is an error.
    """
    addresses, is_name = resolve_host(host)
    for _ in range(PORT_ATTEMPTS):
        sockets: list[socket.socket] = []
        chosen = port
        retry = False
        for address in addresses:
            try:
                sock = _listen(
                    address,
                    chosen,
                    dual_stack=address == "::" and len(addresses) == 1,
                    reuse_port=reuse_port,
                    listen=listen,
                )
            except OSError as exc:
                unbindable = exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT)
                if is_name and unbindable:
                    why = exc.strerror
                    log.warning("%s: cannot listen on %s (%s), skipped", host, address, why)
                    continue
                for opened in sockets:
                    opened.close()
                if port == 0 and sockets and exc.errno == errno.EADDRINUSE:
                    retry = True
                    break
                where = f"{url_host(address)}:{chosen}"
                raise OSError(f"cannot listen on {where}: {exc.strerror}") from None
            sockets.append(sock)
            chosen = sock.getsockname()[1]
        if retry:
            continue
        if not sockets:
            raise OSError(f"cannot listen on {host!r}: none of {', '.join(addresses)} can be bound")
        return sockets
    raise OSError(f"cannot listen on {host!r}: found no port free on all of {', '.join(addresses)}")


def _listen(
    address: str, port: int, *, dual_stack: bool, reuse_port: bool = False, listen: bool = True
) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if dual_stack else 1)
        sock.bind((address, port))
        if listen:
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


def bound_address(sock: socket.socket) -> str:
    """The IP address a socket is bound to (IPv6 without its flow and scope fields)."""
    return str(sock.getsockname()[0])


def url_host(address: str) -> str:
    """``address`` as the host part of a URL or gRPC target (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


@dataclass
class Addresses:
    """Where the server listens, once bound (ports resolved when 0 was asked for).

    Two views, named apart: ``bound_*`` and :meth:`listening_line` say what was bound (a
    wildcard stays a wildcard: the server is reachable from the network); ``http_url`` and
    ``grpc_target`` say where a client *on this machine* connects (a wildcard becomes the
    loopback address of its family), which is what the notebook handle and dashboard use.
    """

    hosts: tuple[str, ...]
    """The IP addresses bound, in order (the first is the one clients are pointed at)."""
    http_port: int
    grpc_port: int | None = None
    tls: bool = False
    """HTTPS and gRPC over TLS (``server.tls``)."""

    @property
    def http_scheme(self) -> str:
        return "https" if self.tls else "http"

    @property
    def grpc_scheme(self) -> str:
        return "grpcs" if self.tls else "grpc"

    @property
    def local_client_host(self) -> str:
        """Where a client on this machine connects: the first bound address, or for a
        wildcard the loopback address of its family."""
        first = self.hosts[0]
        return WILDCARD_CLIENT.get(first, first)

    @property
    def http_url(self) -> str:
        """Base URL for a client on this machine (see :attr:`local_client_host`)."""
        return f"{self.http_scheme}://{url_host(self.local_client_host)}:{self.http_port}"

    @property
    def grpc_target(self) -> str | None:
        """``host:port`` for a gRPC client on this machine; None when gRPC is disabled."""
        if self.grpc_port is None:
            return None
        return f"{url_host(self.local_client_host)}:{self.grpc_port}"

    def bound_http_urls(self) -> list[str]:
        """One URL per bound address, wildcards as bound."""
        return [f"{self.http_scheme}://{url_host(h)}:{self.http_port}" for h in self.hosts]

    def bound_grpc_urls(self) -> list[str]:
        """One ``grpc://`` (``grpcs://`` with TLS) URL per bound address; empty when disabled."""
        if self.grpc_port is None:
            return []
        return [f"{self.grpc_scheme}://{url_host(h)}:{self.grpc_port}" for h in self.hosts]

    def listening_line(self) -> str:
        """``servekit: listening http://A:P grpc://A:Q``, then `` and http://B:P grpc://B:Q``
        for every further address; ``(gRPC disabled)`` ends the line when it is."""
        http, grpc = self.bound_http_urls(), self.bound_grpc_urls()
        pairs = [f"{h} {g}" for h, g in zip(http, grpc, strict=True)] if grpc else http
        tail = "" if grpc else " (gRPC disabled)"
        return "servekit: listening " + " and ".join(pairs) + tail
