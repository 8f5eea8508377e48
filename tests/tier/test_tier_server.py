#!/usr/bin/env python3
"""`pagoda serve` with a disk tier (stories260K): the restart is served from disk,
usage.prompt_tokens_details.cached_tokens counts the tier hits, the output is the
cold run's, and /metrics has the tier series; with per-key salts and a
--kv-tier-secret-file a restart serves a key its own prefix and no other
key's; tier flags without what they need are refused; POST /reset_prefix_cache?tiers=true
clears this engine's entries from a disk tier and a real redis-server (started here)
and only those, answers the counts and shows them on /metrics.
Usage: test_tier_server.py PAGODA DATA_DIR"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverutil import PagodaServer, post_json  # noqa: E402

PAGODA, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
PROMPT = [1] + [3 + (i * 37) % 500 for i in range(140)]  # 141 tokens: 8 full blocks of 16 a hit may cover


def complete_as(srv, key):
    req = urllib.request.Request(srv.url + "/v1/completions",
                                 data=json.dumps({"prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                                  "ignore_eos": True}).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
    with urllib.request.urlopen(req, timeout=300) as r:
        body = json.loads(r.read())
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


def complete(srv):
    st, body = post_json(srv.url + "/v1/completions",
                         {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
    assert st == 200, body
    return body["choices"][0]["text"], body["usage"]["prompt_tokens_details"]["cached_tokens"]


class DiskTierServer(unittest.TestCase):
    def test_restart_is_served_from_disk(self):
        d = tempfile.mkdtemp(prefix="pagoda-tier-e2e-")
        try:
            flags = ["-t", "1", "--num-kv-blocks", "64", "--kv-disk-dir", d, "--kv-disk-size", "64MiB"]
            with PagodaServer(PAGODA, MODEL, flags) as s:
                cold_text, cold_cached = complete(s)
                self.assertEqual(cold_cached, 0)
                for _ in range(100):  # the write-through finishes on the tier's thread
                    m = s.metrics()
                    if m.get('pagoda:kv_tier_stores_total{tier="disk"}', 0) >= 8:
                        break
                    time.sleep(0.05)
                self.assertGreaterEqual(m.get('pagoda:kv_tier_stores_total{tier="disk"}', 0), 8)
                self.assertGreater(m.get('pagoda:kv_tier_bytes_written_total{tier="disk"}', 0), 0)
            with PagodaServer(PAGODA, MODEL, flags) as s:
                text, cached = complete(s)
                self.assertEqual(text, cold_text)
                self.assertEqual(cached, 128)
                m = s.metrics()
                self.assertEqual(m.get('pagoda:kv_tier_hits_total{tier="disk"}'), 8)
                self.assertEqual(m.get('pagoda:kv_tier_hit_tokens_total{tier="disk"}'), 128)
                self.assertEqual(m.get('pagoda:kv_tier_lookups_total{tier="disk"}'), 8)
                self.assertEqual(m.get('pagoda:kv_tier_disk_load_latency_seconds_count'), 8)
                self.assertEqual(m.get('pagoda:kv_tier_errors_total', 0), 0)
                self.assertGreaterEqual(m.get('pagoda:prefix_cache_hits_total'), 128)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_salted_keys_over_a_secret_survive_a_restart_apart(self):
        d = tempfile.mkdtemp(prefix="pagoda-tier-e2e-")
        try:
            secret = os.path.join(d, "secret")
            with open(secret, "w") as f:
                f.write("a deployment secret of 32 bytes.\n")
            flags = ["-t", "1", "--num-kv-blocks", "64", "--kv-disk-dir", os.path.join(d, "kv"),
                     "--kv-disk-size", "64MiB", "--api-key", "key-a,key-b", "--prefix-cache-salt-per-key",
                     "--metrics-without-key", "--kv-tier-secret-file", secret]
            with PagodaServer(PAGODA, MODEL, flags) as s:
                cold_text, cold_cached = complete_as(s, "key-a")
                self.assertEqual(cold_cached, 0)
                for _ in range(100):
                    if s.metrics().get('pagoda:kv_tier_stores_total{tier="disk"}', 0) >= 8:
                        break
                    time.sleep(0.05)
            with PagodaServer(PAGODA, MODEL, flags) as s:
                self.assertEqual(complete_as(s, "key-b"), (cold_text, 0))  # another tenant: no hit
                self.assertEqual(complete_as(s, "key-a"), (cold_text, 128))
                self.assertEqual(s.metrics().get('pagoda:kv_tier_corrupt_total{tier="disk"}', 0), 0)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_reset_with_tiers_clears_this_engines_entries(self):
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            if os.environ.get("CI") == "true":
                self.fail("redis-server / redis-cli missing (scripts/setup installs them)")
            self.skipTest("redis-server / redis-cli missing")
        d = tempfile.mkdtemp(prefix="pagoda-tier-reset-")
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        sock.close()
        redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                  "--appendonly", "no", "--dir", d, "--loglevel", "warning"])

        def cli(*args):
            return subprocess.run(["redis-cli", "-p", str(port)] + list(args), capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        try:
            for _ in range(200):
                if cli("PING") == "PONG":
                    break
                time.sleep(0.02)
            cli("SET", "pagoda:kv:0000000000000001:00000000000000000000000000000001", "another engine's entry")
            disk = os.path.join(d, "kv")
            flags = ["-t", "1", "--num-kv-blocks", "64", "--kv-disk-dir", disk, "--kv-disk-size", "64MiB",
                     "--kv-disk-fsync", "off", "--kv-redis", f"redis://127.0.0.1:{port}"]
            with PagodaServer(PAGODA, MODEL, flags) as s:
                cold_text, _ = complete(s)
                for _ in range(200):  # the write-through finishes on the tiers' threads
                    m = s.metrics()
                    if m.get('pagoda:kv_tier_stores_total{tier="disk"}', 0) >= 8 and \
                            m.get('pagoda:kv_tier_stores_total{tier="redis"}', 0) >= 8:
                        break
                    time.sleep(0.05)
                stored = int(m['pagoda:kv_tier_stores_total{tier="disk"}'])
                self.assertEqual(stored, int(m['pagoda:kv_tier_stores_total{tier="redis"}']))
                files = [f for f in os.listdir(disk) if len(f) == 32]
                self.assertEqual(len(files), stored)
                self.assertEqual(int(cli("DBSIZE")), stored + 1)
                req = urllib.request.Request(s.url + "/reset_prefix_cache?reset_external=true", data=b"", method="POST")
                with urllib.request.urlopen(req, timeout=60) as r:
                    self.assertEqual(r.status, 200)
                    body = json.loads(r.read())
                self.assertEqual(body, {"status": "ok", "tiers": {"disk": stored, "redis": stored}})
                self.assertEqual([f for f in os.listdir(disk) if len(f) == 32], [])
                self.assertEqual(cli("DBSIZE"), "1")  # the other engine's key stays
                self.assertEqual(cli("GET", "pagoda:kv:0000000000000001:00000000000000000000000000000001"),
                                 "another engine's entry")
                m = s.metrics()
                self.assertEqual(m.get('pagoda:kv_tier_cleared_total{tier="disk"}'), stored)
                self.assertEqual(m.get('pagoda:kv_tier_cleared_total{tier="redis"}'), stored)
                text, cached = complete(s)  # nothing left anywhere: computed again, the same text
                self.assertEqual((text, cached), (cold_text, 0))
                self.assertEqual(s.metrics().get('pagoda:kv_tier_hits_total{tier="disk"}', 0), 0)
        finally:
            redis.terminate()
            redis.wait(timeout=30)
            shutil.rmtree(d, ignore_errors=True)

    def test_bad_tier_flags_are_refused(self):
        salted = ["--api-key", "k", "--prefix-cache-salt-per-key"]
        for flags, msg in ((salted + ["--kv-disk-dir", "/tmp/x"], "needs --kv-tier-secret"),
                           (salted + ["--kv-redis", "redis://127.0.0.1:1"], "needs --kv-tier-secret"),
                           (["--kv-disk-dir", "/tmp/x", "--kv-tier-secret", "short"], "at least 16 bytes"),
                           (["--kv-tier-secret-file", "/nonexistent/secret"], "cannot read"),(["--kv-redis", "redis://nohost"], "HOST:PORT"),
                           (["--kv-disk-dir", "/tmp/x", "--kv-disk-size", "0"], "--kv-disk-size"),
                           (["--kv-disk-dir", "/tmp/x", "--no-enable-prefix-caching"], "prefix caching")):
            with self.assertRaises(RuntimeError) as cm:
                with PagodaServer(PAGODA, MODEL, ["-t", "1"] + flags, timeout=60):
                    pass
            self.assertIn(msg, str(cm.exception))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1])
