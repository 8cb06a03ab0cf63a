"""A local Google Cloud Storage for TensorFlow's built-in `gs://` filesystem, plus a pytest fixture.

TensorFlow 2.15's GCS filesystem has no endpoint override: it always speaks HTTPS to
`www.googleapis.com` (JSON API, uploads) and `storage.googleapis.com` (object reads). It does go
through libcurl, which honours `HTTPS_PROXY` and `CURL_CA_BUNDLE`. So the fixture starts:

- `gcp-storage-emulator` (in memory, plain HTTP) on 127.0.0.1 with a free port;
- a CONNECT proxy, in its own process (TensorFlow holds the GIL during gfile I/O, so a proxy thread in
  the test process would hang), that accepts tunnels only to the two Google hosts, terminates TLS with
  a throwaway CA made at session start, and forwards each request to the emulator. It works around
  three emulator quirks: it answers `Expect: 100-continue` itself (curl would otherwise wait 1 s per
  upload), it de-chunks chunked request bodies (the emulator would store the chunk markers inside the
  object), and it turns the emulator's `http://` resumable-upload `Location` back into `https://` so
  the upload's next request comes back through the tunnel.

Every tunnel target is logged (`GcsFake.connect_targets()`), so a test can check that nothing tried to
reach any other host. The proxy never connects anywhere but the emulator on 127.0.0.1.

The proxy also relays plain-HTTP requests (google-cloud-storage with `$STORAGE_EMULATOR_HOST` set to
`GcsFake.proxy_url`), and takes orders from a file it reads at each request: `GcsFake.outage()` (every
connection closed unanswered, the emulator and its objects untouched) and `GcsFake.lose_reply(...)` (a request
relayed, so applied, and its reply never sent). `local_gcs(workdir, upstream_port)` puts it in front of another
server: fake-gcs-server, which enforces generation preconditions (`lease_runs.outage_storage`).

The fixture sets these environment variables for the whole test session (subprocesses, such as CLI
runs, inherit them) and restores them afterwards: `HTTPS_PROXY`/`https_proxy`, `NO_PROXY`/`no_proxy`,
`CURL_CA_BUNDLE`, `GOOGLE_AUTH_TOKEN_FOR_TESTING` (skips auth), `NO_GCE_CHECK`, the `GCS_*` cache
settings (off, so every call sees the emulator's current state) and `GCS_RETRY_CONFIG_*` (two quick
retries: an unreachable endpoint fails in about a second instead of about 200 s).

Usage: TensorFlow reads the GCS settings once, when the process first touches `gs://`. A test module
that uses `gs://` must therefore request the `gcs` fixture before any `gs://` call in the process
(request it in every such test, or with an autouse fixture in the module). Make the fixture visible
with `pytest_plugins = ["gcs_fake"]` in tests/conftest.py, or `from gcs_fake import gcs` in the test
module::

    def test_reads_shards(gcs):
        gcs.make_bucket("data")
        with tf.io.gfile.GFile(gcs.url("data", "a.txt"), "w") as f:
            f.write("x")

Run as a script (`python gcs_fake.py proxy ...`) this module is the proxy process itself.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import datetime
import http.client
import json
import os
import signal
import socket
import socketserver
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

#: The hosts TensorFlow's GCS filesystem talks to; the proxy refuses tunnels to any other.
GOOGLE_STORAGE_HOSTS = ("www.googleapis.com", "storage.googleapis.com")

_PROJECT = "test"
_START_TIMEOUT_S = 15.0
# Hop-by-hop headers, and the ones the proxy recomputes itself; never copied between the two sides.
_NOT_FORWARDED = {"connection", "proxy-connection", "keep-alive", "transfer-encoding", "content-length", "expect", "te",
                  "trailer", "upgrade"}


# --------------------------------------------------------------------------------------------------
# The proxy process
# --------------------------------------------------------------------------------------------------


def _read_body(rfile, headers: http.client.HTTPMessage) -> bytes:
    """The request body, de-chunked when the client sent it chunked."""
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        parts = []
        while True:
            size = int(rfile.readline().split(b";", 1)[0].strip(), 16)
            if size == 0:
                # Trailer section, ended by an empty line.
                while rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return b"".join(parts)
            parts.append(rfile.read(size))
            rfile.readline()  # the CRLF after each chunk
    return rfile.read(int(headers.get("Content-Length", "0") or 0))


class _TunnelHandler(socketserver.StreamRequestHandler):
    """Answers one CONNECT, then relays HTTPS requests inside the tunnel to the emulator."""

    server: "_ProxyServer"

    def handle(self) -> None:
        if self.server.down():
            return  # an outage: the connection is closed unanswered
        request_line = self.rfile.readline(65537).decode("latin-1").split()
        headers = http.client.parse_headers(self.rfile)
        if len(request_line) != 3:
            return
        method, target, _ = request_line
        if method != "CONNECT" and target.startswith("/"):
            # A plain-HTTP request for the emulator itself (google-cloud-storage with $STORAGE_EMULATOR_HOST
            # pointing here): relayed like a tunnel's, so an outage or a lost reply reaches it too.
            self.server.log({"plain": f"{method} {target}"})
            first = (method, target, headers)
            while self._relay_one(self.connection, self.rfile, "plain", first):
                first = None
            return
        self.server.log({"connect": target, "method": method})
        host = target.rsplit(":", 1)[0]
        if method != "CONNECT" or host not in GOOGLE_STORAGE_HOSTS:
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        with self.server.tls.wrap_socket(self.connection, server_side=True) as tls:
            tls.settimeout(120)
            rfile = tls.makefile("rb")
            while self._relay_one(tls, rfile, host):
                pass

    def _relay_one(self, tls, rfile, host: str, first=None) -> bool:
        """Relays one request (`first`: its line and headers, already read); returns whether the client keeps the
        connection open. During an outage the connection is closed unanswered; a request the control file names
        for a lost reply is relayed to the emulator (it is applied) and its reply never sent."""
        if first is None:
            line = rfile.readline(65537)
            if not line.strip():
                return False
            method, path, _ = line.decode("latin-1").split()
            headers = http.client.parse_headers(rfile)
        else:
            method, path, headers = first
        if headers.get("Expect", "").lower() == "100-continue":
            tls.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        body = _read_body(rfile, headers)
        if self.server.down():
            self.server.log({"refused": f"{method} {host}{path}"})
            return False

        upstream = http.client.HTTPConnection("127.0.0.1", self.server.upstream_port, timeout=60)
        try:
            upstream.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in headers.items():
                if name.lower() not in _NOT_FORWARDED:
                    upstream.putheader(name, value)
            upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body)
            response = upstream.getresponse()
            payload = response.read()
        finally:
            upstream.close()
        self.server.log({"request": f"{method} {host}{path}", "status": response.status})
        if self.server.reply_lost(f"{method} {path}", body):
            return False

        out = [f"HTTP/1.1 {response.status} {response.reason}"]
        for name, value in response.getheaders():
            lower = name.lower()
            if lower == "location" and value.startswith(f"http://{host}/"):
                value = "https://" + value[len("http://"):]
            if lower not in _NOT_FORWARDED:
                out.append(f"{name}: {value}")
        length = response.getheader("Content-Length", "0") if method == "HEAD" else str(len(payload))
        keep_alive = headers.get("Connection", "").lower() != "close"
        out.append(f"Content-Length: {length}")
        out.append(f"Connection: {'keep-alive' if keep_alive else 'close'}")
        tls.sendall(("\r\n".join(out) + "\r\n\r\n").encode("latin-1") + (b"" if method == "HEAD" else payload))
        return keep_alive


class _ProxyServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, tls: ssl.SSLContext, upstream_port: int, log_path: Path, control: Optional[Path] = None):
        super().__init__(("127.0.0.1", 0), _TunnelHandler)
        self.tls = tls
        self.upstream_port = upstream_port
        self.control = control
        self._log = open(log_path, "a", buffering=1, encoding="utf-8")
        self._lock = threading.Lock()
        self._lost: set = set()  # the ids of the lost replies already dropped (each is dropped once)

    def log(self, entry: dict) -> None:
        self._log.write(json.dumps(entry) + "\n")

    def _orders(self) -> dict:
        """The control file's orders (`GcsFake.outage`, `GcsFake.lose_reply`): {} without one."""
        try:
            return json.loads(self.control.read_text()) if self.control else {}
        except (OSError, ValueError):
            return {}

    def down(self) -> bool:
        return bool(self._orders().get("down"))

    def reply_lost(self, request: str, body: bytes) -> bool:
        """Whether this request's reply is to be lost (after it was applied): the first order not yet carried out
        that it meets (`GcsFake.lose_reply`)."""
        with self._lock:
            for order in self._orders().get("lose_reply", []):
                if order["id"] in self._lost or order["body"].encode() not in body or \
                        not all(part in request for part in order["request"]) or \
                        any(part in request for part in order["unless"]):
                    continue
                self._lost.add(order["id"])
                self.log({"reply_lost": request, "id": order["id"]})
                return True
        return False


def _proxy_main(argv: List[str]) -> None:
    parser = argparse.ArgumentParser(prog="gcs_fake.py proxy")
    parser.add_argument("--upstream-port", type=int, required=True)
    parser.add_argument("--cert", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--control", help="a JSON file of orders read at each request: outages, lost replies")
    args = parser.parse_args(argv)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(args.cert, args.key)
    server = _ProxyServer(tls, args.upstream_port, Path(args.log), Path(args.control) if args.control else None)
    # The parent reads the port from the first line of stdout.
    print(server.server_address[1], flush=True)
    server.serve_forever()


# --------------------------------------------------------------------------------------------------
# Certificates
# --------------------------------------------------------------------------------------------------


def write_certificates(directory: Path) -> Dict[str, Path]:
    """Makes a throwaway CA and a server certificate for the Google storage hosts.

    Args:
        directory: where to write `ca.pem`, `server.pem` and `server-key.pem`.

    Returns:
        The paths, keyed `ca`, `cert` and `key`.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.timezone.utc)
    valid_from, valid_to = now - datetime.timedelta(days=1), now + datetime.timedelta(days=7)

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tpulaunch test CA")])
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, GOOGLE_STORAGE_HOSTS[0])]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(valid_from).not_valid_after(valid_to)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(h) for h in GOOGLE_STORAGE_HOSTS]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )

    paths = {"ca": directory / "ca.pem", "cert": directory / "server.pem", "key": directory / "server-key.pem"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


# --------------------------------------------------------------------------------------------------
# Child processes and the fixture
# --------------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the child gets SIGTERM when the test process dies, even if it crashes."""

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _direct_opener() -> urllib.request.OpenerDirector:
    # Talks to the emulator itself, never through a proxy from the environment.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _wait_for_emulator(process: subprocess.Popen, base_url: str, log_path: Path) -> None:
    deadline = time.monotonic() + _START_TIMEOUT_S
    opener = _direct_opener()
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"gcp-storage-emulator exited with {process.returncode}: {log_path.read_text()}")
        try:
            with opener.open(f"{base_url}/storage/v1/b?project={_PROJECT}", timeout=1):
                return
        except (urllib.error.URLError, ConnectionError, socket.timeout):
            if time.monotonic() > deadline:
                raise RuntimeError(f"gcp-storage-emulator did not answer within {_START_TIMEOUT_S} s: "
                                   f"{log_path.read_text()}")
            time.sleep(0.05)


def gcs_environment(proxy_port: int, ca_bundle: Path) -> Dict[str, str]:
    """The environment variables that point TensorFlow's GCS filesystem at the proxy.

    Args:
        proxy_port: the CONNECT proxy's port on 127.0.0.1.
        ca_bundle: the PEM file of the CA that signed the proxy's certificate.

    Returns:
        Variable name to value.
    """
    proxy = f"http://127.0.0.1:{proxy_port}"
    return {
        "HTTPS_PROXY": proxy,
        "https_proxy": proxy,  # libcurl prefers the lower-case one when both are set
        "NO_PROXY": "",
        "no_proxy": "",
        "CURL_CA_BUNDLE": str(ca_bundle),
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "dummy",
        "NO_GCE_CHECK": "true",
        "GCS_STAT_CACHE_MAX_AGE": "0",
        "GCS_MATCHING_PATHS_CACHE_MAX_AGE": "0",
        "GCS_READ_CACHE_MAX_SIZE_MB": "0",
        "GCS_RETRY_CONFIG_MAX_RETRIES": "2",
        "GCS_RETRY_CONFIG_INIT_DELAY_TIME_US": "100000",
    }


@dataclass
class GcsFake:
    """The running emulator and proxy, as a test sees them.

    Attributes:
        emulator_url: the emulator's own plain-HTTP address (for direct inspection).
        env: the environment variables the fixture set; pass `{**os.environ, **env}` to a subprocess
            that builds its environment from scratch.
        proxy_log: the proxy's JSON-lines log (one line per tunnel and per relayed request).
        control: the proxy's orders (`outage`, `lose_reply`), read at each request.
        proxy_url: the proxy's address; it relays plain-HTTP requests to the emulator as well (for
            google-cloud-storage: `$STORAGE_EMULATOR_HOST` set to it).
    """

    emulator_url: str
    env: Dict[str, str]
    proxy_log: Path
    control: Optional[Path] = None
    proxy_url: str = ""
    _buckets: List[str] = field(default_factory=list)
    _orders: dict = field(default_factory=dict)

    def _order(self, **orders) -> None:
        self._orders.update(orders)
        temporary = self.control.with_suffix(".tmp")
        temporary.write_text(json.dumps(self._orders))
        temporary.replace(self.control)  # the proxy reads the old orders or the new ones, never half

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Cloud Storage unreachable for the block: the proxy closes every connection and request unanswered (new
        ones and the open ones at their next request); the emulator and what it holds are untouched, and answer
        again after the block."""
        self._order(down=True)
        try:
            yield
        finally:
            self._order(down=False)

    def lose_reply(self, request: List[str], body: str = "", unless: List[str] = ()) -> str:
        """Loses the reply of the next request whose line holds every string of `request` and none of `unless`,
        and whose body holds `body`: the emulator applies it, the client never hears back (its connection is
        closed). Orders wait their turn: a request meets at most one. Returns the order's id; `replies_lost()`
        lists the ids of those carried out."""
        order_id = f"lost-{len(self._orders.get('lose_reply', []))}"
        self._order(lose_reply=[*self._orders.get("lose_reply", []),
                                {"id": order_id, "request": list(request), "unless": list(unless), "body": body}])
        return order_id

    def replies_lost(self) -> List[str]:
        return [entry["id"] for entry in self.log_entries() if "reply_lost" in entry]

    def make_bucket(self, name: str) -> str:
        """Creates a bucket in the emulator and returns its name."""
        request = urllib.request.Request(
            f"{self.emulator_url}/storage/v1/b?project={_PROJECT}", data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"}, method="POST")
        with _direct_opener().open(request, timeout=10):
            pass
        self._buckets.append(name)
        return name

    @staticmethod
    def url(bucket: str, path: str = "") -> str:
        """`gs://bucket/path`."""
        return f"gs://{bucket}/{path.lstrip('/')}"

    def log_entries(self) -> List[dict]:
        """Everything the proxy has logged so far, oldest first."""
        return [json.loads(line) for line in self.proxy_log.read_text().splitlines() if line]

    def connect_targets(self) -> List[str]:
        """Every `host:port` a client asked the proxy to tunnel to, in order."""
        return [entry["connect"] for entry in self.log_entries() if "connect" in entry]

    @contextlib.contextmanager
    def unreachable(self) -> Iterator[str]:
        """Points `gs://` at a port where nothing listens, for the duration of the block.

        Yields:
            The dead proxy address in use.
        """
        dead = f"http://127.0.0.1:{free_port()}"
        saved = {name: os.environ.get(name) for name in ("HTTPS_PROXY", "https_proxy")}
        os.environ.update({name: dead for name in saved})
        try:
            yield dead
        finally:
            _restore(saved)


def _restore(saved: Dict[str, Optional[str]]) -> None:
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def local_gcs(workdir: Path, upstream_port: Optional[int] = None) -> Iterator[GcsFake]:
    """The emulator (in memory; or, with `upstream_port`, the server already listening there) and the proxy to it,
    for the block. Sets no environment variable: `GcsFake.env` says what a process needs to reach them."""
    preexec = _die_with_parent(os.getpid())
    emulator: Optional[subprocess.Popen] = None
    if upstream_port is None:
        upstream_port = free_port()
        emulator_log = workdir / "emulator.log"
        with open(emulator_log, "wb") as log:
            emulator = subprocess.Popen(
                [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", "127.0.0.1", "--port",
                 str(upstream_port), "--in-memory", "--quiet"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
    emulator_url = f"http://127.0.0.1:{upstream_port}"
    proxy: Optional[subprocess.Popen] = None
    try:
        if emulator is not None:
            _wait_for_emulator(emulator, emulator_url, emulator_log)
        certs = write_certificates(workdir)
        proxy_log, control = workdir / "proxy.log", workdir / "proxy-orders.json"
        proxy_log.touch()
        proxy = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "proxy", "--upstream-port", str(upstream_port),
             "--cert", str(certs["cert"]), "--key", str(certs["key"]), "--log", str(proxy_log),
             "--control", str(control)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, preexec_fn=preexec)
        port_line = proxy.stdout.readline().strip()
        if not port_line:
            raise RuntimeError(f"the GCS proxy exited with {proxy.wait()} before listening")
        yield GcsFake(emulator_url=emulator_url, env=gcs_environment(int(port_line), certs["ca"]),
                      proxy_log=proxy_log, control=control, proxy_url=f"http://127.0.0.1:{int(port_line)}")
    finally:
        if proxy is not None:
            _stop(proxy)
            proxy.stdout.close()
        if emulator is not None:
            _stop(emulator)


@pytest.fixture(scope="session")
def gcs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsFake]:
    """A local GCS that TensorFlow's `gs://` filesystem reaches, for the whole session."""
    with local_gcs(tmp_path_factory.mktemp("gcs_fake")) as fake:
        saved = {name: os.environ.get(name) for name in fake.env}
        os.environ.update(fake.env)
        try:
            yield fake
        finally:
            _restore(saved)


if __name__ == "__main__":
    if sys.argv[1:2] != ["proxy"]:
        sys.exit("usage: gcs_fake.py proxy --upstream-port N --cert PEM --key PEM --log FILE")
    _proxy_main(sys.argv[2:])
