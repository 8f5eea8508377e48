"""Start and stop a real `pagoda serve` on a free loopback port for tests/benchmarks."""
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import unittest
import urllib.error
import urllib.request


def wait_listening(proc, log, timeout):
    """Reads proc's stderr lines into `log` until "listening on http://HOST:PORT" (returns
    PORT), the process exits or `timeout` seconds pass (returns None)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                return None
            continue
        log.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            return int(m.group(1))
    return None


def terminate(proc):
    """SIGTERM, then SIGKILL after 20 s; waits for the process either way."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class PagodaServer:
    def __init__(self, binary, model, extra=(), env=None, timeout=120, command="serve"):
        # command: "router" starts `pagoda router` (same -m/--host/--port and "listening on" line).
        self.binary, self.model, self.extra, self.command = binary, model, list(extra), command
        self.env = dict(os.environ, **(env or {}))
        self.timeout = timeout
        self.proc = None
        self.port = None
        self.log = []
        self.preexec_fn = None  # e.g. a resource limit for the server process

    def __enter__(self):
        cmd = [self.binary, self.command, "-m", self.model, "--host", "127.0.0.1", "--port", "0"] + self.extra
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=self.env,
                                     preexec_fn=self.preexec_fn)
        self.port = wait_listening(self.proc, self.log, self.timeout)
        if self.proc.poll() is not None and self.port is None:
            raise RuntimeError("server exited early:\n" + "".join(self.log))
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.log))
        # Keep draining stderr so the server never blocks on a full pipe.
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        return self

    def _drain(self):
        for line in self.proc.stderr:
            self.log.append(line)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def metrics(self):
        # One /metrics parser, bench/serve_load.py's (imported here: it imports this module).
        bench = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench")
        if bench not in sys.path:
            sys.path.insert(0, bench)
        from serve_load import scrape
        return scrape(self.url)

    def __exit__(self, *exc):
        if self.proc:
            terminate(self.proc)
        if self.proc and getattr(self, "_drainer", None):
            self._drainer.join(timeout=5)  # reads to EOF now that the process is gone
            self.proc.stderr.close()
        return False


class OneServerPerClass:
    """unittest.TestCase mixin: one server (cls.srv) shared by every test of the class,
    started from the class's SERVER = (binary, model, extra flags)."""
    SERVER = None

    @classmethod
    def setUpClass(cls):
        cls.srv = PagodaServer(*cls.SERVER).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)


class ServerTestCase(OneServerPerClass, unittest.TestCase):
    """One `pagoda serve` (cls.srv) and an `openai` client on it (cls.client), shared
    by the tests of a class. Subclasses set SERVER = (binary, model, [args]) and may
    set CLIENT_TIMEOUT (seconds)."""
    CLIENT_TIMEOUT = 120

    @classmethod
    def setUpClass(cls):
        import openai
        super().setUpClass()
        cls.client = openai.OpenAI(base_url=cls.srv.url + "/v1", api_key="none", max_retries=0,
                                   timeout=cls.CLIENT_TIMEOUT)


def raw_exchange(port, data, half_close=False, timeout=60):
    """Sends raw bytes, optionally shuts down the sending side, reads until EOF."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(data)
    if half_close:
        s.shutdown(socket.SHUT_WR)
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        out += chunk
    s.close()
    return out


def post_json(url, body, timeout=300):
    """(status, parsed JSON body) of a POST; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())
