"""Which ``Host`` header values the HTTP listener answers: the guard against DNS rebinding.

A page on ``http://rebind.attacker.example:8000/`` whose name the attacker then points at
127.0.0.1 (or at a machine on the victim's network) is, for the browser, talking to its own
origin: it may read the answers and send any method and header, so neither CORS nor the
cross-site checks of app/servekit/rest/access.py stop it. What the browser cannot change is the
``Host`` header: it is the attacker's name. So the listener answers only names it was meant to
be reached by (as Jupyter does), decided here from serve.yaml and the bound addresses:

* loopback names: ``localhost``, ``*.localhost`` (RFC 6761 reserves them for this machine),
  and any loopback address (127.0.0.0/8, ``::1``);
* the addresses the server is bound to, and ``server.host`` itself when it is a name;
* ``server.allowedHosts``: names, ``*.example.com`` (any name under example.com, not
  example.com itself), IP addresses, or ``*`` (no check at all);
* names no public DNS answers, so no attacker can serve a page under them: a name without a
  dot (``gpu-box``, a Kubernetes Service in the same namespace: the resolver completes it from
  this network's search domains) and names under ``.local`` (mDNS, and Kubernetes'
  ``svc.cluster.local``) or ``.internal`` (reserved for private networks);
* bound to a wildcard (``0.0.0.0``, ``::``): every IP literal too. A URL holding an IP
  literal makes that address the page's origin, which no DNS answer can move, so only this
  server (or a forward to it) could have served such a page. Any other name clients use (a
  load balancer's, an Ingress's, KServe's ``NAME.NAMESPACE.example.com``) must be listed: a
  public name is exactly what an attacker controls.

The port is not compared (a proxy or a port forward changes it; the name is what matters), and
a request without ``Host`` (HTTP/1.0, never a browser) is answered. gRPC's ``:authority`` is not
checked: browsers cannot speak gRPC over HTTP/2 with trailers, so no page can reach it.

The check runs once per request at the HTTP edge (app/servekit/http/connection.py), before any
routing, so it covers the inference fast path too; a verdict is remembered per ``Host`` value, so
the usual request costs one dictionary lookup."""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger("servekit.http")

LOOPBACK_NAMES = frozenset({"localhost"})
WILDCARDS = frozenset({"0.0.0.0", "::"})
PRIVATE_SUFFIXES = (".local", ".internal")
"""Names under these no public DNS answers (RFC 6762 mDNS, ICANN's private-use ``.internal``)."""
SETTING = "server.allowedHosts"
MAX_REMEMBERED = 1024
"""Distinct ``Host`` values whose verdict is remembered (allowed ones only: a client sending
random names must not grow memory)."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` is an address only this machine reaches (127.0.0.0/8, ::1, localhost).
    Any other name counts as reachable from outside: the safe side when in doubt."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def host_name(value: bytes) -> str:
    """The name of a ``Host`` header value: lower case, port, IPv6 brackets and one trailing
    dot removed (``[::1]:8000`` -> ``::1``, ``Example.COM.:80`` -> ``example.com``)."""
    text = value.decode("latin-1").strip().lower()
    if text.startswith("["):
        end = text.find("]")
        return text[1:end] if end > 0 else text
    name, colon, port = text.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        text = name
    return text[:-1] if text.endswith(".") else text


def check_entry(entry: str) -> str:
    """One ``server.allowedHosts`` entry, normalised; ValueError says what is wrong with it."""
    text = entry.strip().lower()
    if text == "*":
        return text
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    if _ip(text) is not None:
        return str(_ip(text))
    name = text[2:] if text.startswith("*.") else text
    labels = name.rstrip(".").split(".")
    if not name or any(
        not label or len(label) > 63 or not all(c.isalnum() or c in "-_" for c in label)
        for label in labels
    ):
        raise ValueError(
            f"{entry!r} is not a host name: give a name (models.example.com), "
            "'*.example.com' for every name under one, an IP address, or '*' for any host "
            "(no scheme, port or path)"
        )
    return ("*." if text.startswith("*.") else "") + name.rstrip(".")


@dataclass
class HostPolicy:
    """The ``Host`` names one HTTP listener answers (see the module docstring)."""

    names: frozenset[str]
    """Exact names and addresses allowed (normalised as :func:`host_name` returns them)."""
    suffixes: tuple[str, ...]
    """``.example.com`` for each ``*.example.com`` entry (and ``.localhost``)."""
    any_ip: bool
    """Bound to a wildcard: every IP literal is allowed."""
    remembered: dict[bytes, bool] = field(default_factory=dict, repr=False)
    """Raw ``Host`` values already allowed (the edge reads this first)."""
    _logged: float = field(default=-1.0, repr=False)
    _unlogged: int = field(default=0, repr=False)

    def allows(self, value: bytes) -> bool:
        """Whether a request with this raw ``Host`` value may be answered (remembered)."""
        if self.remembered.get(value):
            return True
        allowed = self._allows(host_name(value))
        if allowed and len(self.remembered) < MAX_REMEMBERED:
            self.remembered[value] = True
        return allowed

    def _allows(self, name: str) -> bool:
        if name in self.names or name.endswith(self.suffixes):
            return True
        address = _ip(name)
        if address is None:
            return not name or "." not in name or name.endswith(PRIVATE_SUFFIXES)
        if address.is_loopback or self.any_ip:
            return True
        mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
        return mapped is not None and (mapped.is_loopback or str(mapped) in self.names)

    def refusal(self, value: bytes) -> str:
        """The error a refused request gets: what was refused and the setting to change.
        Logged as a WARNING at most once a second (the rest are counted into the next line),
        so a page hammering the server cannot flood the log."""
        shown = host_name(value)[:100]
        now = time.monotonic()
        if now - self._logged >= 1.0:
            more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
            log.warning("refused a request for host %r (%s)%s", shown, SETTING, more)
            self._logged, self._unlogged = now, 0
        else:
            self._unlogged += 1
        return (
            f"refused a request for host {shown!r}: this server answers only its own "
            f"names and addresses (a guard against DNS rebinding); add the name to "
            f"{SETTING} in serve.yaml if clients reach the server by it"
        )


def host_policy(host: str, bound: Iterable[str], allowed: Iterable[str]) -> HostPolicy | None:
    """The policy of a listener bound to ``bound`` addresses for ``server.host`` = ``host``
    with ``server.allowedHosts`` = ``allowed``; None when ``*`` turns the check off."""
    entries = [check_entry(e) for e in allowed]
    if "*" in entries:
        return None
    names = set(LOOPBACK_NAMES)
    suffixes = [".localhost"]
    bound_list = [str(a) for a in bound]
    for address in bound_list:
        if address not in WILDCARDS:
            names.add(str(_ip(address) or address))
    own = host.strip().strip("[]").lower().rstrip(".")
    if own and own not in WILDCARDS:
        names.add(str(_ip(own) or own))
    for entry in entries:
        if entry.startswith("*."):
            suffixes.append(entry[1:])
        else:
            names.add(entry)
    any_ip = any(a in WILDCARDS for a in bound_list) or own in WILDCARDS
    return HostPolicy(frozenset(names), tuple(suffixes), any_ip)
