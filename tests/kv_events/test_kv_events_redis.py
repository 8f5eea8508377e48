#!/usr/bin/env python3
"""KV events of the Redis tier (issue 37): a Redis key of the engine's that Redis
itself removes -- its TTL passed, or maxmemory evicted it -- is published as
BlockRemoved(medium="redis"), from Redis's keyspace notifications (the tier sets
notify-keyspace-events when CONFIG is allowed; src/tier/redis_key_events.h).

Each test starts its own redis-server and `pagoda serve` (a synth tiny-gemma3:
two KV groups, 4-token blocks) with --kv-redis and --kv-events-config, follows
the events with test_kv_events_e2e.py's subscriber (vLLM's event types; every
removal of a block not held, every double store, fails it) and compares its
view with the engine's own (GET /dashboard/kv_blocks) and with Redis (DBSIZE).

1. TTL (--kv-redis-ttl): the tier turns the notifications on; every key Redis
   expires is removed from the view, and a key another client made persistent
   (PERSIST, as a replica renewing it would) stays announced past its expiry
   (the tier's own clock alone would have reported it gone).
2. maxmemory eviction (allkeys-lru, no TTL): the keys Redis evicts leave the
   view; the view equals DBSIZE and the engine's own.
3. CONFIG refused (renamed away): the tier logs the requirement and reports
   expiries by its own clock, as before notifications.

  test_kv_events_redis.py PAGODA [TEST_NAME ...]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import test_kv_events_e2e as e2e  # noqa: E402  (reads PAGODA from argv[1]; skips without pyzmq/msgspec)
from serverutil import PagodaServer, post_json  # noqa: E402

PAGODA = sys.argv[1]
BLOCK = e2e.BLOCK


class RedisServer:
    def __init__(self, extra=()):
        self.port = e2e.free_port()
        self.dir = tempfile.mkdtemp(prefix="pagoda-kv-events-redis-")
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir, "--loglevel", "warning"] + list(extra))
        for _ in range(500):
            if self.cli("PING") == "PONG":
                return
            time.sleep(0.02)
        raise RuntimeError("redis-server did not start")

    def cli(self, *args):
        p = subprocess.run(["redis-cli", "-p", str(self.port)] + list(args), capture_output=True, text=True,
                           timeout=30)
        return p.stdout.strip()

    def dbsize(self):
        return int(self.cli("DBSIZE") or -1)

    def info(self, field):
        for line in self.cli("INFO").splitlines():
            if line.startswith(field + ":"):
                return int(line.split(":", 1)[1])
        return None

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        shutil.rmtree(self.dir, ignore_errors=True)


def redis_count(view):
    return sum(len(v) for k, v in view.items() if k[1] == "redis")


class KvEventsRedis(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
            if os.environ.get("CI") == "true":
                raise RuntimeError("redis-server / redis-cli missing (scripts/setup installs them)")
            raise unittest.SkipTest("redis-server / redis-cli missing")
        cls.tmp = tempfile.mkdtemp(prefix="pagoda-kv-events-redis-model-")
        cls.model = os.path.join(cls.tmp, "tiny-gemma3.gguf")
        subprocess.run([PAGODA, "synth", "--preset", "tiny-gemma3", "-o", cls.model], check=True,
                       stdout=subprocess.DEVNULL)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def serve(self, redis, extra=()):
        self.pub, self.rep = e2e.free_port(), e2e.free_port()
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{self.pub}",
               "replay_endpoint": f"tcp://*:{self.rep}", "topic": "kv-events", "buffer_steps": 100000,
               "hwm": 100000}
        flags = ["-t", "1", "--block-size", str(BLOCK), "--num-kv-blocks", "256", "--kv-redis",
                 f"redis://127.0.0.1:{redis.port}", "--kv-events-config", json.dumps(cfg)] + list(extra)
        return PagodaServer(PAGODA, self.model, flags)

    def settle(self, srv, sub, redis, what, want=None, tries=150):
        """Until the subscriber's view equals the engine's and its Redis part holds DBSIZE keys (or `want`).
        The poke (2 tokens: no whole block, nothing stored) runs an engine step: tier events ride on one."""
        last = None
        for _ in range(tries):
            e2e.complete(srv, [1, 2], max_tokens=1)
            time.sleep(0.1)
            sub.apply()
            mine, theirs = e2e.nonempty(sub.view), e2e.nonempty(e2e.engine_view(srv))
            n = redis.dbsize() if want is None else want
            if mine == theirs and redis_count(mine) == n:
                return mine
            last = (redis_count(mine), redis_count(theirs), n, mine == theirs)
        self.fail(f"{what}: (view, engine, want, views equal) = {last}")

    def test_1_ttl_expiry_from_notifications_and_a_persisted_key_stays(self):
        redis = RedisServer()
        try:
            with self.serve(redis, ["--kv-redis-ttl", "4"]) as srv:
                flags = redis.cli("CONFIG", "GET", "notify-keyspace-events").splitlines()[-1]
                for f in "Exe":
                    self.assertIn(f, flags, "the tier did not turn keyspace notifications on")
                self.assertIn("notify-keyspace-events set to", "".join(srv.log))
                sub = e2e.Subscriber(self.pub, self.rep)
                try:
                    time.sleep(0.3)
                    for k in range(4):
                        e2e.complete(srv, [1] + [9 + (k * 37 + i * 5) % 300 for i in range(18 + k)], max_tokens=2)
                    view = self.settle(srv, sub, redis, "after the stores")
                    t_stored = time.time()  # every key is in Redis (DBSIZE = the view's)
                    n = redis_count(view)
                    self.assertGreaterEqual(n, 16)
                    # Another client keeps one key (a replica renewing it would): it must stay announced.
                    # (The first that has not expired yet: settling may take seconds on a loaded machine.)
                    keys = redis.cli("KEYS", "pagoda:kv:*").splitlines()
                    kept = next((k for k in keys if redis.cli("PERSIST", k) == "1"), None)
                    self.assertIsNotNone(kept, "every key expired before one could be kept")
                    for _ in range(300):  # Redis expires the rest (its active cycle: well within seconds)
                        if redis.dbsize() == 1:
                            break
                        time.sleep(0.05)
                    self.assertEqual(redis.dbsize(), 1)
                    self.assertEqual(redis.cli("EXISTS", kept), "1")
                    self.settle(srv, sub, redis, "after Redis expired the keys", want=1)
                    self.assertIn(("BlockRemoved", 0, "redis"), sub.kinds)
                    self.assertIn(("BlockRemoved", 1, "redis"), sub.kinds)
                    # Past the kept key's expiry (it was stored before t_stored) and the tier's grace
                    # (5 s) for its notice, and a sweep: still there, still announced.
                    time.sleep(max(0.0, t_stored + 4 + 5 + 2 - time.time()))
                    self.settle(srv, sub, redis, "past the kept key's expiry", want=1)
                    self.assertEqual(redis.cli("EXISTS", kept), "1")
                    self.assertGreaterEqual(srv.metrics().get('pagoda:kv_tier_expired_total{tier="redis"}', 0), n - 1)
                finally:
                    sub.close()
        finally:
            redis.close()

    def test_2_maxmemory_evictions_are_removed(self):
        redis = RedisServer(["--maxmemory-policy", "allkeys-lru"])
        try:
            with self.serve(redis) as srv:
                sub = e2e.Subscriber(self.pub, self.rep)
                try:
                    time.sleep(0.3)
                    e2e.complete(srv, [1] + [9 + i for i in range(24)], max_tokens=2)
                    view = self.settle(srv, sub, redis, "after the first stores")
                    n0 = redis_count(view)
                    self.assertGreater(n0, 0)
                    # Room for about 40 more entries than now: the prompts below store far more.
                    used = redis.info("used_memory")
                    per_key = max(1, (used - int(redis.info("used_memory_startup") or 0)) // n0)
                    self.assertEqual(redis.cli("CONFIG", "SET", "maxmemory", str(used + 40 * per_key)), "OK")
                    for k in range(24):
                        e2e.complete(srv, [1] + [9 + (k * 53 + i * 7) % 300 for i in range(30)], max_tokens=2)
                    evicted = redis.info("evicted_keys")
                    self.assertGreater(evicted, 0, "Redis evicted nothing: the test did not test")
                    view = self.settle(srv, sub, redis, "after the evictions")
                    self.assertIn(("BlockRemoved", 0, "redis"), sub.kinds)
                    # Nothing expires here (no TTL): every removal came from an eviction notice.
                    print(f"{evicted} keys evicted, {redis_count(view)} announced = DBSIZE {redis.dbsize()}",
                          flush=True)
                finally:
                    sub.close()
        finally:
            redis.close()

    def test_3_config_refused_falls_back_to_the_tiers_clock(self):
        redis = RedisServer(["--rename-command", "CONFIG", ""])
        try:
            with self.serve(redis, ["--kv-redis-ttl", "2"]) as srv:
                self.assertIn("set notify-keyspace-events to include 'Exe'", "".join(srv.log))
                sub = e2e.Subscriber(self.pub, self.rep)
                try:
                    time.sleep(0.3)
                    e2e.complete(srv, [1] + [40 + i for i in range(20)], max_tokens=2)
                    view = self.settle(srv, sub, redis, "after the stores")
                    self.assertGreater(redis_count(view), 0)
                    for _ in range(300):
                        if redis.dbsize() == 0:
                            break
                        time.sleep(0.05)
                    self.settle(srv, sub, redis, "after the keys expired", want=0)
                    self.assertIn(("BlockRemoved", 0, "redis"), sub.kinds)
                finally:
                    sub.close()
        finally:
            redis.close()


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1] + sys.argv[2:], verbosity=2)
