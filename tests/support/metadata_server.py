"""A local HTTPS server publishing client ID metadata documents, for tests: its own CA and certificate (for
127.0.0.1 and the given names), made with `cryptography`; point SSL_CERT_FILE at ``ca_file`` to trust it.

Paths: ``/<name>.json`` serves ``documents[name]`` (a dict is JSON-encoded with its ``client_id`` filled in as
the URL it was fetched from); ``/big.json`` is over 16 KiB, ``/slow.json`` answers after ``slow_seconds``, ``/redirect.json``
redirects to ``/good.json``. ``hits`` counts requests per path."""

import datetime
import ipaddress
import json
import ssl
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _cert(subject, issuer, public_key, signing_key, *, ca, names=()):
    now = datetime.datetime.now(datetime.UTC)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
               .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(
            [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))] + [x509.DNSName(n) for n in names]), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def make_tls(directory, names=("localhost",)):
    """(ca_file, cert_file, key_file) for a throwaway CA and a server certificate signed by it."""
    directory = Path(directory)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "yuzu test CA")])
    ca = _cert(ca_name, ca_name, ca_key.public_key(), ca_key, ca=True)
    cert = _cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]), ca_name, key.public_key(), ca_key,
                 ca=False, names=names)
    files = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    files[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    files[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return tuple(str(f) for f in files)


class MetadataServer:
    def __init__(self, directory, documents, slow_seconds=3.0, names=("localhost",)):
        self.ca_file, cert_file, key_file = make_tls(directory, names)
        self.documents, self.slow_seconds, self.hits = dict(documents), slow_seconds, Counter()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                server.hits[self.path] += 1
                name = self.path.removeprefix("/").removesuffix(".json")
                if name == "redirect":
                    self.send_response(302)
                    self.send_header("Location", "/good.json")
                    self.end_headers()
                    return
                if name == "slow":
                    time.sleep(server.slow_seconds)
                doc = server.documents.get(name)
                if name == "big":
                    doc = {**server.documents["good"], "client_name": "x" * 20000}
                if doc is None:
                    self.send_error(404)
                    return
                if isinstance(doc, dict):
                    doc = json.dumps({"client_id": f"https://{self.headers['Host']}{self.path}", **doc})
                body = doc.encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert_file, key_file)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.host = "127.0.0.1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path, host=None):
        return f"https://{host or self.host}:{self.port}/{path}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
