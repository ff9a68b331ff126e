"""Test support: a real fenced on a free loopback port with a data
directory of its own, fencectl to install the guards, and the servers of
`make services` (FENCE_TEST_POSTGRES, FENCE_TEST_REDIS)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.parse
import urllib.request
from typing import Any, Dict, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
SRC = os.path.join(PKG, "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

_no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def vectors() -> Dict[str, Any]:
    """vectors returns testdata/protocol/vectors.json, read from the repository."""
    with open(os.path.join(REPO, "testdata", "protocol", "vectors.json"), encoding="utf-8") as f:
        return json.load(f)


_build_lock = threading.Lock()


def go_bin(name: str) -> str:
    """go_bin returns cmd/NAME of the repository: $FENCED_BIN or
    $FENCECTL_BIN, or build/bin/NAME, built here if missing (make test-py
    builds it first)."""
    env = {"fenced": "FENCED_BIN", "fencectl": "FENCECTL_BIN"}[name]
    if os.environ.get(env):
        return os.environ[env]
    path = os.path.join(PKG, "build", "bin", name)
    with _build_lock:
        if not os.path.exists(path):
            subprocess.run(["go", "build", "-o", path, f"./cmd/{name}"], cwd=REPO, check=True, timeout=600)
    return path


def install_guard(url: str) -> None:
    """install_guard runs `fencectl guard install URL`, as a user does;
    installing again is harmless."""
    r = subprocess.run([go_bin("fencectl"), "guard", "install", url], capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        raise AssertionError(f"fencectl guard install failed ({r.returncode}):\n{r.stdout}{r.stderr}")


class Fenced:
    """Fenced is a fenced process on 127.0.0.1:0 with a temporary data
    directory: start() waits until it is the ready leader, stop() ends it."""

    def __init__(self, *args: str):
        self.args = args
        self.dir = tempfile.mkdtemp(prefix="fence-py-")
        self.proc: Optional[subprocess.Popen] = None
        self.url = ""
        self._log: list = []

    def log(self) -> str:
        return "".join(self._log)

    def start(self) -> "Fenced":
        # After a restart, the address it had: its clients find it again.
        listen = self.url[len("http://"):] if self.url else "127.0.0.1:0"
        self.url = ""
        self.proc = subprocess.Popen(
            [go_bin("fenced"), "--data-dir", os.path.join(self.dir, "data"), "--listen", listen, *self.args],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        found = threading.Event()

        def read() -> None:
            assert self.proc is not None and self.proc.stderr is not None
            for line in self.proc.stderr:
                self._log.append(line)
                m = re.search(r'msg="fenced started" listen=(\S+)', line)
                if m and not found.is_set():
                    self.url = f"http://{m.group(1)}"
                    found.set()
            found.set()

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        if not found.wait(60) or not self.url:
            self.stop()
            raise AssertionError(f"fenced did not start:\n{self.log()}")
        # Ready once it leads: a single node elects itself within a second
        # or so. Bounded at 300 tries of 100 ms.
        for _ in range(300):
            try:
                with _no_proxy.open(f"{self.url}/readyz", timeout=2) as res:
                    if res.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        raise AssertionError(f"fenced at {self.url} never became ready:\n{self.log()}")

    def restart(self) -> "Fenced":
        """restart stops fenced and starts it again on the same address with
        the same data: a new term, whose leader holds no events of the old
        one."""
        self.stop(keep_data=True)
        return self.start()

    def stop(self, keep_data: bool = False) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc is not None and self.proc.stderr is not None:
            self._reader.join(10)
            self.proc.stderr.close()
        if not keep_data:
            shutil.rmtree(self.dir, ignore_errors=True)

    def rpc(self, method: str, body: Dict[str, Any]) -> Tuple[int, Any]:
        """rpc calls a LeaseService method directly, for what the client does
        not offer (Get, a Release behind a holder's back)."""
        req = urllib.request.Request(
            f"{self.url}/fence.v1.LeaseService/{method}", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"}, method="POST",
        )
        try:
            with _no_proxy.open(req, timeout=30) as res:
                return res.status, json.loads(res.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def metric(self, name: str) -> float:
        """metric reads an unlabelled counter from /metrics (0 if absent)."""
        with _no_proxy.open(f"{self.url}/metrics", timeout=10) as res:
            text = res.read().decode()
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0


def server_url(name: str) -> Optional[str]:
    """server_url returns the named environment variable (make services'
    servers), or None to skip the tests that need it; under CI=true a
    missing server fails instead."""
    v = os.environ.get(name)
    if v:
        return v
    if os.environ.get("CI") == "true":
        raise AssertionError(
            f"{name} is not set: under CI=true the tests that need its server must run "
            "(make services; set -a; source scripts/services.env)"
        )
    return None


def needs(name: str, module: str) -> str:
    """needs returns server_url(name), skipping the test when the server
    or the Python module is missing (failing under CI=true)."""
    url = server_url(name)
    if url is None:
        raise unittest.SkipTest(f"{name} is not set")
    try:
        __import__(module)
    except ImportError as err:
        if os.environ.get("CI") == "true":
            raise AssertionError(f"{module} is not installed: make services installs it (Debian's python3-{module})") from err
        raise unittest.SkipTest(f"{module} is not installed")
    return url


def until(what: str, cond, timeout: float = 20.0) -> None:
    """until waits for cond, checking every 20 ms, at most timeout seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"never came true: {what}")


def mysql_server():
    """mysql_server returns make services' MariaDB as PyMySQL's connect
    arguments and as the mysql:// URL fencectl guard install takes, from
    FENCE_TEST_MYSQL (Go's form, USER:PASS@tcp(HOST:PORT)/DB)."""
    dsn = needs("FENCE_TEST_MYSQL", "pymysql")
    m = re.fullmatch(r"([^:@]*)(?::([^@]*))?@tcp\(([^:)]+):(\d+)\)/([^?]*)(?:\?.*)?", dsn)
    if m is None:
        raise AssertionError(f"FENCE_TEST_MYSQL={dsn!r} is not USER:PASS@tcp(HOST:PORT)/DB")
    user, password, host, port, db = m.group(1), m.group(2) or "", m.group(3), int(m.group(4)), m.group(5)
    url = f"mysql://{urllib.parse.quote(user)}:{urllib.parse.quote(password)}@{host}:{port}/{db}"
    return dict(user=user, password=password, host=host, port=port, database=db), url


def needs_cryptography(test):
    """needs_cryptography skips test where the cryptography package is
    missing (failing under CI=true, where make services installs it)."""
    try:
        import cryptography  # noqa: F401
    except ImportError:
        if os.environ.get("CI") == "true":
            return test
        return unittest.skip("cryptography is not installed (Debian: python3-cryptography)")(test)
    return test


class Proxy:
    """Proxy forwards TCP connections on a loopback port of its own to a
    backend ("host:port"); cut() breaks every connection and refuses new
    ones until mend(). The way to cut a client off from fenced without
    stopping fenced."""

    def __init__(self, backend: str):
        import socket

        self.backend = backend
        self._lock = threading.Lock()
        self._cut = False
        self._conns: list = []
        self._ln = socket.create_server(("127.0.0.1", 0))
        self.url = "http://127.0.0.1:%d" % self._ln.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket

        while True:
            try:
                inc, _ = self._ln.accept()
            except OSError:
                return
            with self._lock:
                cut, backend = self._cut, self.backend
            if cut:
                inc.close()
                continue
            host, port = backend.rsplit(":", 1)
            try:
                out = socket.create_connection((host, int(port)), timeout=5)
                out.settimeout(None)
            except OSError:
                inc.close()
                continue
            with self._lock:
                self._conns += [inc, out]
            for a, b in ((inc, out), (out, inc)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src, dst) -> None:
        import socket

        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        import socket

        with self._lock:
            self._cut = True
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def mend(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._ln.close()
