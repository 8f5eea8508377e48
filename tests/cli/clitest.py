"""Start a `pagoda` command line as given (no flags added), for the launch-command tests."""
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverutil import terminate, wait_listening  # noqa: E402


class Launched:
    """`pagoda ARGS...` until it listens (then .port) or exits (then .rc, .log)."""

    def __init__(self, binary, args, timeout=60):
        self.proc = subprocess.Popen([binary] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.log = []
        self.port = wait_listening(self.proc, self.log, timeout)
        self.rc = self.proc.wait() if self.port is None and self.proc.poll() is not None else None
        if self.port is None and self.rc is None:
            self.stop()
            raise RuntimeError("neither listening nor exited:\n" + "".join(self.log))
        self.out = ""
        if self.port is not None:
            self._drain = threading.Thread(target=lambda: [self.log.append(x) for x in self.proc.stderr], daemon=True)
            self._drain.start()
        else:
            self.log.append(self.proc.stderr.read())
            self.out = self.proc.stdout.read()
            self.proc.stderr.close()
            self.proc.stdout.close()

    def text(self):
        return "".join(self.log)

    def post(self, path, body, headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    def get(self, path, headers=None):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.read().decode()

    def stop(self):
        terminate(self.proc)
        if getattr(self, "_drain", None):
            self._drain.join(timeout=5)
            self._drain = None
            self.proc.stderr.close()
            self.proc.stdout.close()


def parse_series(text):
    """{metric name: [(label dict, value), ...]} of every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$', line)
        assert m, "not a Prometheus sample line: " + line
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', m.group(3) or ""))
        out.setdefault(m.group(1), []).append((labels, float(m.group(4))))
    return out
