"""``server.tls``: the certificate, key and client CAs, checked when serve.yaml is compiled.

A certificate that cannot be read, a key that does not match it or is encrypted, or a client CA
file without certificates is a config error naming its key and line (like any other mistake in
serve.yaml), not a traceback when the listeners open. The files are read once, here: HTTPS gets
an ``ssl.SSLContext`` built from them and gRPC the same PEM bytes, so both listeners present the
same certificate and accept the same clients.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path

from servekit.config.schema import TlsConfig

CERT_MARK = b"-----BEGIN CERTIFICATE-----"
KEY_MARK = b"PRIVATE KEY-----"


class TlsError(ValueError):
    """A ``server.tls`` file that cannot be used; ``field`` is its serve.yaml path."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(message)
        self.field = field_path


@dataclass(frozen=True)
class TlsFiles:
    """The server's TLS material, read and checked."""

    cert_file: Path
    key_file: Path
    client_ca_file: Path | None
    cert_chain: bytes = field(repr=False)
    private_key: bytes = field(repr=False)
    client_ca: bytes | None = field(default=None, repr=False)

    @property
    def mutual(self) -> bool:
        """Whether every client must present a certificate signed by a client CA."""
        return self.client_ca is not None

    def server_context(self) -> ssl.SSLContext:
        """An SSL context for the HTTPS listener (TLS 1.2 or newer)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert_file, self.key_file, password=_no_password)
        if self.client_ca is not None:
            context.load_verify_locations(cadata=self.client_ca.decode("ascii", "replace"))
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def pinned_client_context(self) -> ssl.SSLContext:
        """A client context trusting exactly this server's own certificate: how the notebook
        handle of a server in this process reaches it, at a loopback address the certificate
        need not name (the pin replaces the host name check). Only the leaf is trusted, never
        an intermediate CA the chain file may also hold."""
        end = b"-----END CERTIFICATE-----"
        start = self.cert_chain.index(CERT_MARK)
        leaf = self.cert_chain[start : self.cert_chain.index(end, start) + len(end)]
        context = ssl.create_default_context(cadata=leaf.decode("ascii"))
        context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
        context.check_hostname = False
        return context


def _no_password() -> bytes:
    """Never prompt on a terminal for a key's password (a server has nobody to answer)."""
    raise TlsError("server.tls.keyFile", "the private key is encrypted")


def resolve_tls(tls: TlsConfig | None, base_dir: Path) -> TlsFiles | None:
    """Read and check ``server.tls`` (paths relative to ``base_dir``); None when not set."""
    if tls is None:
        return None
    cert_path, cert = _read("certFile", tls.cert_file, base_dir)
    key_path, key = _read("keyFile", tls.key_file, base_dir)
    if CERT_MARK not in cert:
        raise TlsError("server.tls.certFile", f"{tls.cert_file} holds no PEM certificate")
    if KEY_MARK not in key:
        raise TlsError("server.tls.keyFile", f"{tls.key_file} holds no PEM private key")
    if b"ENCRYPTED" in key:
        raise TlsError(
            "server.tls.keyFile",
            f"{tls.key_file} is encrypted; give an unencrypted key (protect the file instead)",
        )
    ca_path, ca = None, None
    if tls.client_ca_file is not None:
        ca_path, ca = _read("clientCaFile", tls.client_ca_file, base_dir)
        if CERT_MARK not in ca:
            raise TlsError(
                "server.tls.clientCaFile", f"{tls.client_ca_file} holds no PEM certificate"
            )
    files = TlsFiles(cert_path, key_path, ca_path, cert, key, ca)
    try:
        files.server_context()
    except ssl.SSLError as exc:
        field_path = "server.tls.keyFile"
        message = f"{tls.key_file} does not match {tls.cert_file} ({exc.reason or exc})"
        if ca is not None and _loads_chain(files):
            field_path = "server.tls.clientCaFile"
            message = f"{tls.client_ca_file} is not a usable CA bundle ({exc.reason or exc})"
        raise TlsError(field_path, message) from None
    return files


def _loads_chain(files: TlsFiles) -> bool:
    """Whether the certificate and key load on their own (so a failure was the CA's)."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            files.cert_file, files.key_file, password=_no_password
        )
    except ssl.SSLError:
        return False
    return True


def _read(key: str, name: str, base_dir: Path) -> tuple[Path, bytes]:
    path = base_dir / name
    try:
        return path, path.read_bytes()
    except OSError as exc:
        raise TlsError(f"server.tls.{key}", f"cannot read {name}: {exc.strerror}") from None
