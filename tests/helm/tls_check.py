"""Check a generated webhook certificate the way the API server will: a real TLS handshake
(stdlib ssl over memory BIOs) trusting only the caBundle and verifying the Service DNS name."""

from __future__ import annotations

import ssl
import tempfile
from pathlib import Path


def _pump(src: ssl.MemoryBIO, dst: ssl.MemoryBIO) -> None:
    data = src.read()
    if data:
        dst.write(data)


def handshake(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, hostname: str) -> None:
    """Raises ssl.SSLError (e.g. CERTIFICATE_VERIFY_FAILED) unless a client trusting only ca_pem
    accepts the server cert for hostname."""
    with tempfile.TemporaryDirectory() as tmp:
        cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        server_ctx.load_cert_chain(cert, key)
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client_ctx.load_verify_locations(cadata=ca_pem.decode())
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(c_in, c_out, server_hostname=hostname)
    server = server_ctx.wrap_bio(s_in, s_out, server_side=True)
    done = {"client": False, "server": False}
    for _ in range(20):
        for name, conn in (("client", client), ("server", server)):
            if done[name]:
                continue
            try:
                conn.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
        _pump(c_out, s_in)
        _pump(s_out, c_in)
        if all(done.values()):
            return
    raise ssl.SSLError("handshake did not complete")
