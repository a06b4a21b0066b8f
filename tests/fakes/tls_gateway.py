"""A TLS-terminating gateway in front of a plain-HTTP server, with a self-signed certificate.

What an HTTPS deployment looks like to the client (nginx or a cloud load balancer in front of
vLLM), reduced to its essence: TLS in, plain TCP out, bytes forwarded as they come. It lets the
client-accuracy benchmark and the HTTPS client's tests measure against the paced server's truth
through a real TLS stack. The forwarding hop (one extra localhost write/read per chunk) is part
of what a gateway costs and is in the figures measured through it.

``make_self_signed(dir)`` writes ``cert.pem``/``key.pem`` for ``localhost`` and 127.0.0.1 with
the ``openssl`` command line; the client trusts it through ``SSL_CERT_FILE``.

Run it: ``python benchmarks/tls_gateway.py --target-port 8123 --cert-dir DIR``; it prints
``TLS_GATEWAY_READY port=<port>`` when it accepts connections.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import socket
import ssl
import subprocess
import sys
from pathlib import Path


def make_self_signed(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate and key for localhost/127.0.0.1 in ``directory``."""
    if shutil.which("openssl") is None:
        raise RuntimeError("the openssl command line is needed to make a self-signed certificate")
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-days", "2", "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(cert),
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True,
    )
    return cert, key


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


async def serve(target_port: int, cert: Path, key: Path, port: int = 0,
                ready: asyncio.Future[int] | None = None) -> None:
    """Accept TLS on ``port`` (0: any) and forward every connection to 127.0.0.1:``target_port``."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)

    async def handle(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", target_port)
        for writer in (client_w, server_w):
            sock = writer.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pipe(client_r, server_w), _pipe(server_r, client_w))

    server = await asyncio.start_server(handle, "127.0.0.1", port, ssl=context)
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready.set_result(bound)
    else:
        print(f"TLS_GATEWAY_READY port={bound}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    """Run the gateway until killed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--cert-dir", type=Path, required=True)
    args = parser.parse_args(argv)
    cert, key = args.cert_dir / "cert.pem", args.cert_dir / "key.pem"
    if not cert.is_file():
        cert, key = make_self_signed(args.cert_dir)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.target_port, cert, key, args.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
