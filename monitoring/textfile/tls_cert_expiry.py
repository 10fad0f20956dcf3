#!/usr/bin/python3
"""fastpoll-tls-cert-expiry: TLS certificates' end of validity, for node_exporter's textfile dir.

    fastpoll-tls-cert-expiry --cert /etc/fastpoll/tls/fullchain.pem [--cert ...] \
        --out DIR/fastpoll_tls.prom

Neither node_exporter nor any Debian 12 exporter but the blackbox exporter (one more daemon, and a
TLS handshake to each listener) reads a certificate's notAfter, so a timer runs this on each host
that serves TLS (nginx's fastpoll_tls_certificate) and node_exporter serves the file:

    fastpoll_tls_cert_not_after_timestamp_seconds{path}  notAfter of its first (leaf) certificate
    fastpoll_tls_cert_read_success{path}                 0: missing, or not a certificate

The rules alert on both (CertificateExpiresSoon, CertificateUnreadable). The file is replaced
atomically. Standard library only: it runs with the host's python3.
"""

from __future__ import annotations

import argparse
import os
import ssl
import sys
import tempfile


def not_after(path: str) -> float:
    """notAfter of the first certificate in a PEM file, in seconds since the epoch."""
    # The ssl module's own decoder (what ssl.getpeercert() returns, for a file): no openssl
    # binary and no third-party package on the host.
    decoded = ssl._ssl._test_decode_cert(path)  # type: ignore[attr-defined]
    return float(ssl.cert_time_to_seconds(decoded["notAfter"]))


def render(certs: dict[str, float | None]) -> str:
    """Prometheus text for every certificate (None: it could not be read)."""
    out = [
        "# HELP fastpoll_tls_cert_not_after_timestamp_seconds notAfter of the certificate.\n"
        "# TYPE fastpoll_tls_cert_not_after_timestamp_seconds gauge\n"
    ]
    ok = [
        "# HELP fastpoll_tls_cert_read_success 1 if the certificate file could be read.\n"
        "# TYPE fastpoll_tls_cert_read_success gauge\n"
    ]
    for path, end in certs.items():
        label = 'path="' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if end is not None:
            out.append(f"fastpoll_tls_cert_not_after_timestamp_seconds{{{label}}} {int(end)}\n")
        ok.append(f"fastpoll_tls_cert_read_success{{{label}}} {0 if end is None else 1}\n")
    return "".join(out + ok)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--cert", action="append", required=True, help="a PEM file (repeatable)")
    ap.add_argument("--out", required=True, help="the .prom file to write ('-': stdout)")
    args = ap.parse_args(argv)
    certs: dict[str, float | None] = {}
    for path in args.cert:
        try:
            certs[path] = not_after(path)
        except (OSError, ssl.SSLError, ValueError, KeyError) as e:
            print(f"fastpoll-tls-cert-expiry: {path}: {e}", file=sys.stderr)
            certs[path] = None
    text = render(certs)
    if args.out == "-":
        sys.stdout.write(text)
        return 0
    # Beside the target, then renamed over it: node_exporter never reads half a file.
    fd, tmp = tempfile.mkstemp(
        prefix=".fastpoll_tls.", dir=os.path.dirname(os.path.abspath(args.out))
    )
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, args.out)
    except BaseException:
        os.unlink(tmp)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
