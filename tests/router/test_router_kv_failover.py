"""A replica killed under load behind `pagoda router --kv-events` (issue 37, Done
when: "A replica killed mid-run: no request fails, its index entries are gone
within one health interval, and when it returns with a disk tier its entries
come back from its start-up events").

Three real `pagoda serve` replicas of SmolLM2 (-t 1), each with a disk tier and
its own KV event publisher (--kv-events-config), behind the router. Four client
threads send non-streamed completions of 8 shared 4-block prefixes the whole
time. Then:
1. The replica the router's index credits with the most blocks is SIGKILLed:
   its index entries (every medium) are gone within one health interval (slack
   for the loaded machine below), and every request of the run, before and
   after, answers 200 (the router retries a request whose replica failed on
   another one: nothing of a non-streamed answer was sent yet).
2. Its disk tier's files all get the same mtime (the order a restarted tier
   finds its entries in is then its directory's: a child may come before its
   parent), and it restarts on the same ports and disk tier. Its start-up
   events (AllBlocksCleared, BlockStored(disk) per entry, parents first) bring
   its entries back: the router's index holds exactly the engine's own disk
   blocks (GET /dashboard/kv_blocks) and refused none as an orphan.
3. Load goes on through the restart: still no request fails.

  test_router_kv_failover.py PAGODA_BINARY MODEL_GGUF
"""
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.path.insert(0, HERE)

BINARY = MODEL = None
BS = 16
HEALTH_S = 1.0
SLACK_S = 2.0  # the health round's GET /health and the metrics scrape on a loaded 2-core machine
N = 3


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prompt_ids(k, i):
    """Prefix k (4 whole blocks, ids in SmolLM2's vocabulary) and a distinct 5-token suffix i."""
    return [1000 + 211 * k + j for j in range(4 * BS)] + [20000 + (i * 7 + j) % 9000 for j in range(5)]


class Load:
    """Client threads sending completions through the router until stopped; every outcome kept."""

    def __init__(self, url, threads=4):
        self.url, self.stop_ev, self.lock = url, threading.Event(), threading.Lock()
        self.ok, self.bad, self.n = 0, [], 0
        self.threads = [threading.Thread(target=self.run, args=(t,), daemon=True) for t in range(threads)]
        for t in self.threads:
            t.start()

    def run(self, t):
        from serverutil import post_json
        i = 0
        while not self.stop_ev.is_set():
            i += 1
            body = dict(prompt=prompt_ids((t * 3 + i) % 8, t * 100000 + i), max_tokens=3, temperature=0)
            try:
                status, out = post_json(self.url + "/v1/completions", body, timeout=120)
                good = status == 200 and len(out["choices"]) == 1
            except Exception as e:  # noqa: BLE001 -- a connection error is a failed request too
                status, out, good = 0, str(e), False
            with self.lock:
                self.n += 1
                if good:
                    self.ok += 1
                else:
                    self.bad.append((status, str(out)[:300]))

    def count(self):
        with self.lock:
            return self.n

    def finish(self):
        self.stop_ev.set()
        for t in self.threads:
            t.join(timeout=180)


class RouterKvFailoverTest(unittest.TestCase):
    def setUp(self):
        from serverutil import PagodaServer
        self.tmp = tempfile.mkdtemp(prefix="pagoda-router-kv-failover-")
        self.ports = [(free_port(), free_port(), free_port()) for _ in range(N)]  # http, pub, replay
        self.reps = [self.serve(i) for i in range(N)]
        args = []
        for r in self.reps:
            args += ["--replica", r.url]
        args += ["--kv-events", "--block-size", str(BS), "--health-interval", str(HEALTH_S),
                 "--kv-events-endpoint", ",".join(f"tcp://127.0.0.1:{p}" for _, p, _ in self.ports),
                 "--kv-replay-endpoint", ",".join(f"tcp://127.0.0.1:{q}" for _, _, q in self.ports)]
        self.router = PagodaServer(BINARY, MODEL, args, command="router").__enter__()
        self.labels = ['replica="%s"' % r.url for r in self.reps]

    def tearDown(self):
        for s in [self.router] + self.reps:
            s.__exit__(None, None, None)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def serve(self, i):
        from serverutil import PagodaServer
        http, pub, rep = self.ports[i]
        cfg = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
               "replay_endpoint": f"tcp://*:{rep}", "topic": "kv-events", "buffer_steps": 100000, "hwm": 100000}
        flags = ["-t", "1", "--port", str(http), "--block-size", str(BS), "--num-kv-blocks", "256",
                 "--kv-disk-dir", os.path.join(self.tmp, f"disk{i}"), "--kv-disk-size", "64MiB",
                 "--kv-disk-fsync", "off", "--kv-events-config", json.dumps(cfg)]
        return PagodaServer(BINARY, MODEL, flags).__enter__()

    def rm(self):
        return self.router.metrics()

    def blocks(self, m, i, medium):
        return m.get(f'pagoda:router_kv_index_blocks{{{self.labels[i]},medium="{medium}"}}', 0)

    def all_blocks(self, m, i):
        return sum(self.blocks(m, i, med) for med in ("cpu", "disk", "redis", "other"))

    def engine_disk(self, i):
        with urllib.request.urlopen(self.reps[i].url + "/dashboard/kv_blocks", timeout=60) as r:
            blocks = json.loads(r.read())["blocks"]
        return {h for g, medium, h in blocks if medium == "disk" and g == 0}

    def wait_for(self, cond, what, timeout):
        deadline = time.time() + timeout
        while not cond():
            self.assertLess(time.time(), deadline, what)
            time.sleep(0.02)

    def test_killed_replica_no_failure_dropped_then_back_from_its_disk(self):
        load = Load(self.router.url)
        try:
            # The replicas serve and publish; the router indexes what they hold (the ring may leave
            # one replica without any of the 8 prefixes: the victim is the one holding most).
            def warm():
                m = self.rm()
                best = max(range(N), key=lambda i: self.all_blocks(m, i))
                return load.count() >= 40 and self.blocks(m, best, "cpu") >= 12 and self.blocks(m, best, "disk") >= 12
            self.wait_for(warm, "the router never indexed a replica's blocks", timeout=240)
            m = self.rm()
            victim = max(range(N), key=lambda i: self.all_blocks(m, i))
            disk = os.path.join(self.tmp, f"disk{victim}")
            n_before = load.count()
            self.reps[victim].proc.send_signal(signal.SIGKILL)
            self.reps[victim].proc.wait()
            t0 = time.time()
            self.wait_for(lambda: self.all_blocks(self.rm(), victim) == 0,
                          "the killed replica's index entries stayed", timeout=HEALTH_S + SLACK_S)
            dropped_s = time.time() - t0
            print(f"replica {victim}: index entries gone {dropped_s:.2f} s after the kill "
                  f"(health interval {HEALTH_S} s)", flush=True)
            m = self.rm()
            self.assertEqual(m.get(f'pagoda:router_replica_healthy{{{self.labels[victim]}}}'), 0)
            # The load goes on over the two others.
            self.wait_for(lambda: load.count() >= n_before + 30, "no progress without the killed replica", 240)
            with load.lock:
                self.assertEqual(load.bad, [], "requests failed around the kill")

            # 2. Same mtime on every entry: the start-up scan's order is the directory's.
            files = [f for f in os.listdir(disk) if len(f) == 32]
            self.assertGreaterEqual(len(files), 12)
            stamp = time.time() - 60
            for f in files:
                os.utime(os.path.join(disk, f), (stamp, stamp))
            orphans0 = m.get(f'pagoda:router_kv_rejected_total{{{self.labels[victim]},reason="orphan"}}', 0)
            self.reps[victim].__exit__(None, None, None)  # reaps the old process's log reader
            self.reps[victim] = self.serve(victim)
            self.assertIn(f"{len(files)} entries", "".join(self.reps[victim].log))  # the disk tier found them all
            n_restart = load.count()

            def back():  # healthy again (its resync done) and the index = its disk (the load may add blocks)
                mine = self.engine_disk(victim)
                m = self.rm()
                return m.get(f'pagoda:router_replica_healthy{{{self.labels[victim]}}}') == 1 and \
                    len(mine) >= len(files) and self.blocks(m, victim, "disk") == len(mine)
            self.wait_for(back, "the restarted replica's disk entries did not come back into the index", 60)
            m = self.rm()
            self.assertEqual(m.get(f'pagoda:router_kv_rejected_total{{{self.labels[victim]},reason="orphan"}}', 0), orphans0,
                             "a re-announced block came before its parent")
            print(f"replica {victim}: {len(files)} disk entries back in the router's index", flush=True)
            self.wait_for(lambda: load.count() >= n_restart + 20, "no progress after the restart", 240)
        finally:
            load.finish()
        print(f"{load.n} requests, {len(load.bad)} failed; router retries "
              f"{self.rm().get('pagoda:router_retries_total', 0):.0f}", flush=True)
        self.assertEqual(load.bad, [], "requests failed")
        self.assertGreater(load.ok, 0)


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    for mod in ("zmq", "msgspec"):
        try:
            __import__(mod)
        except ImportError:
            print(f"{'error' if os.environ.get('CI') == 'true' else 'skipped'}: python module {mod} is missing")
            sys.exit(1 if os.environ.get("CI") == "true" else 77)
    if not os.path.exists(MODEL):
        print(f"{'error' if os.environ.get('CI') == 'true' else 'skipped'}: {MODEL} is missing")
        sys.exit(1 if os.environ.get("CI") == "true" else 77)
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
