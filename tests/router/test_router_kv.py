"""End-to-end test of `pagoda router --kv-events` (issue 37): two real `pagoda serve`
replicas (-t 1) behind the router, and two fake KV event publishers
(kv_fake_publisher.py: pyzmq + msgspec, vLLM's event types) standing in for the
replicas' own events until the engine publishes them. The replicas' own
/metrics (request_success_total) tell which one served each request.

  test_router_kv.py PAGODA_BINARY MODEL_GGUF [TEST_NAME ...]

1. A prompt the ring sends to replica X goes to the other one, Y, once Y's
   publisher says it holds the prompt's first blocks (routing kind kv_events).
2. A message the router missed (a sequence gap) is recovered through the replay
   socket, and what it stored routes the next request.
3. A publisher that restarts at sequence 0 has its replica's entries dropped.
4. A replica killed: its entries are gone within one health interval (plus the
   /health round trip) and its prompts are served by the other replica.
5. --kv-min-match 3 (a second router on the same replicas and publishers): a
   2-block match leaves the prompt to the ring, a 3-block one routes on the events.
"""
import os
import signal
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.path.insert(0, HERE)

BINARY = MODEL = None
BS = 16  # the block size the fake publishers announce
HEALTH_S = 1.0


def need(modname):
    try:
        return __import__(modname)
    except ImportError:
        # CI=true must fail, not skip (scripts/setup installs pyzmq and msgspec).
        print(f"{'error' if os.environ.get('CI') == 'true' else 'skipped'}: python module {modname} is missing")
        sys.exit(1 if os.environ.get("CI") == "true" else 77)


def prompt_ids(k, blocks=4):
    """Token ids of prompt k: `blocks` whole blocks, then 3 more tokens (ids in SmolLM2's vocabulary)."""
    return [1000 + 97 * k + i for i in range(blocks * BS + 3)]


class RouterKvEventsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        from serverutil import PagodaServer
        from kv_fake_publisher import FakePublisher
        cls.reps = [PagodaServer(BINARY, MODEL, ["-t", "1"]).__enter__() for _ in range(2)]
        cls.pubs = [FakePublisher() for _ in range(2)]
        args = []
        for r in cls.reps:
            args += ["--replica", r.url]
        args += ["--kv-events", "--block-size", str(BS), "--affinity-blocks", "2",
                 "--health-interval", str(HEALTH_S),
                 "--kv-events-endpoint", ",".join(p.endpoint for p in cls.pubs),
                 "--kv-replay-endpoint", ",".join(p.replay_endpoint for p in cls.pubs)]
        cls.router = PagodaServer(BINARY, MODEL, args, command="router").__enter__()
        cls.router_min3 = PagodaServer(BINARY, MODEL, args + ["--kv-min-match", "3"], command="router").__enter__()
        cls.labels = ['replica="%s"' % r.url for r in cls.reps]
        # ZeroMQ's slow joiner: a SUB socket misses what is published before its
        # subscription arrives. Empty batches until the router has seen one of each.
        deadline = time.time() + 30
        for i, p in enumerate(cls.pubs):
            while cls.kv(f"pagoda:router_kv_messages_total{{{cls.labels[i]}}}") == 0 or \
                    cls.router_min3.metrics().get(f"pagoda:router_kv_messages_total{{{cls.labels[i]}}}", 0) == 0:
                assert time.time() < deadline, "the router never received the fake publishers' messages"
                p.publish([])
                time.sleep(0.05)

    @classmethod
    def tearDownClass(cls):
        for s in [cls.router, cls.router_min3] + cls.reps:
            s.__exit__(None, None, None)
        for p in cls.pubs:
            p.close()

    @classmethod
    def kv(cls, name):
        return cls.router.metrics().get(name, 0)

    def blocks(self, i, medium="cpu"):
        return self.kv(f'pagoda:router_kv_index_blocks{{{self.labels[i]},medium="{medium}"}}')

    def wait_for(self, cond, what, timeout=10):
        deadline = time.time() + timeout
        while not cond():
            self.assertLess(time.time(), deadline, what)
            time.sleep(0.02)

    def served(self):
        from test_router import served
        return served(self.reps)

    def which(self, ids, router=None):
        """Sends one completion of token ids; returns the index of the replica that served it."""
        from serverutil import post_json
        before = self.served()
        status, body = post_json((router or self.router).url + "/v1/completions",
                                 dict(prompt=ids, max_tokens=2, temperature=0))
        self.assertEqual(status, 200, body)
        deadline = time.time() + 10
        while True:  # a replica counts a request just after answering it
            after = self.served()
            moved = [i for i in range(2) if after[i] != before[i]]
            if moved or time.time() > deadline:
                break
            time.sleep(0.005)
        self.assertEqual(len(moved), 1, (before, after))
        return moved[0]

    def stored(self, ids, blocks, first_hash, medium="cpu"):
        from kv_fake_publisher import BlockStored
        return BlockStored(block_hashes=[first_hash + b for b in range(blocks)], parent_block_hash=None,
                           token_ids=ids[:blocks * BS], block_size=BS, medium=medium)

    def decisions(self, kind):
        return self.kv(f'pagoda:router_routing_decisions_total{{kind="{kind}"}}')

    def test_0_prompt_cache_key_is_the_ring_key(self):
        # Prompts that share no block but share a prompt_cache_key go to one replica
        # (the ring by the key: nobody's events hold these prompts).
        from serverutil import post_json
        ring0 = self.decisions("affinity") + self.decisions("fallback")
        for j, key in enumerate(["user-1", "user-2", "user-3", "user-4"]):
            seen = set()
            for k in range(3):
                before = self.served()
                status, body = post_json(self.router.url + "/v1/completions",
                                         dict(prompt=prompt_ids(20 + 3 * j + k, 2), max_tokens=1,
                                              prompt_cache_key=key))
                self.assertEqual(status, 200, body)
                self.wait_for(lambda: self.served() != before, "no replica counted the request")
                after = self.served()
                seen |= {i for i in range(2) if after[i] != before[i]}
            self.assertEqual(len(seen), 1, key)
        self.assertEqual(self.decisions("affinity") + self.decisions("fallback"), ring0 + 12)

    def test_1_routes_to_the_replica_holding_the_prefix(self):
        ids = prompt_ids(1)
        ring0 = self.decisions("affinity") + self.decisions("fallback")
        x = self.which(ids)  # nobody holds it: the ring decides
        self.assertEqual(self.decisions("affinity") + self.decisions("fallback"), ring0 + 1)
        y = 1 - x
        before = self.blocks(y)
        self.pubs[y].publish([self.stored(ids, 3, 0x5100)])
        self.wait_for(lambda: self.blocks(y) == before + 3, "the router never indexed the stored blocks")
        kv0 = self.decisions("kv_events")
        for _ in range(3):
            self.assertEqual(self.which(ids), y)
        self.assertEqual(self.decisions("kv_events"), kv0 + 3)
        # A shorter RAM prefix on X does not win against Y's 3 blocks.
        from kv_fake_publisher import BlockRemoved
        self.pubs[x].publish([self.stored(ids, 2, 0x5200)])
        self.wait_for(lambda: self.blocks(x) >= 2, "X's blocks were not indexed")
        self.assertEqual(self.which(ids), y)
        # Y evicts 2 of its 3: X's 2 RAM blocks win.
        self.pubs[y].publish([BlockRemoved(block_hashes=[0x5101, 0x5102])])
        self.wait_for(lambda: self.blocks(y) == before + 1, "the removal was not applied")
        self.assertEqual(self.which(ids), x)
        # X demotes its 2 blocks to disk and adds 2 more there: 4 tier blocks (score
        # 4 x 0.5 = 2) beat Y's 1 RAM block.
        self.pubs[x].publish([BlockRemoved(block_hashes=[0x5200, 0x5201]),
                              self.stored(ids, 4, 0x5300, medium="disk")])
        self.wait_for(lambda: self.blocks(x, "disk") >= 4, "the demotion was not applied")
        self.assertEqual(self.which(ids), x)
        self.assertEqual(self.decisions("kv_events"), kv0 + 6)

    def test_1b_min_match_leaves_short_matches_to_the_ring(self):
        ids = prompt_ids(6)
        r3 = self.router_min3

        def decisions3(kind):
            return r3.metrics().get(f'pagoda:router_routing_decisions_total{{kind="{kind}"}}', 0)

        def blocks3(i):
            return r3.metrics().get(f'pagoda:router_kv_index_blocks{{{self.labels[i]},medium="cpu"}}', 0)
        x = self.which(ids, r3)  # nobody holds it: the ring's owner
        y = 1 - x
        b1, b3 = self.blocks(y), blocks3(y)
        self.pubs[y].publish([self.stored(ids, 2, 0x9100)])
        self.wait_for(lambda: self.blocks(y) == b1 + 2 and blocks3(y) == b3 + 2, "2 blocks were not indexed")
        kv3, ring3 = decisions3("kv_events"), decisions3("affinity") + decisions3("fallback")
        for _ in range(2):  # 2 < 3 blocks: the ring keeps it on X; the default router follows the events
            self.assertEqual(self.which(ids, r3), x)
            self.assertEqual(self.which(ids), y)
        self.assertEqual(decisions3("kv_events"), kv3)
        self.assertEqual(decisions3("affinity") + decisions3("fallback"), ring3 + 2)
        # The third block (its parent the second): Y holds 3, the minimum: the events decide.
        from kv_fake_publisher import BlockStored
        self.pubs[y].publish([BlockStored(block_hashes=[0x9102], parent_block_hash=0x9101,
                                          token_ids=ids[2 * BS:3 * BS], block_size=BS, medium="cpu")])
        self.wait_for(lambda: blocks3(y) == b3 + 3, "the third block was not indexed")
        for _ in range(2):
            self.assertEqual(self.which(ids, r3), y)
        self.assertEqual(decisions3("kv_events"), kv3 + 2)

    def test_2_gap_is_recovered_through_replay(self):
        ids = prompt_ids(2)
        x = self.which(ids)
        y = 1 - x
        rec = f'pagoda:router_kv_gaps_total{{{self.labels[y]},outcome="recovered"}}'
        g0, before, replays = self.kv(rec), self.blocks(y), self.pubs[y].replays
        g3 = self.router_min3.metrics().get(rec, 0)
        self.pubs[y].publish([self.stored(ids, 4, 0x6100)], drop=True)  # the router misses this one
        self.pubs[y].publish([])  # the next one shows the gap
        self.wait_for(lambda: self.kv(rec) == g0 + 1, "the gap was not recovered")
        # Both routers (the --kv-min-match one too) saw the gap: one replay each.
        self.wait_for(lambda: self.router_min3.metrics().get(rec, 0) == g3 + 1, "the second router did not recover")
        self.assertEqual(self.pubs[y].replays, replays + 2)
        self.assertEqual(self.blocks(y), before + 4)
        self.assertEqual(self.kv(f'pagoda:router_kv_gaps_total{{{self.labels[y]},outcome="lost"}}'), 0)
        self.assertEqual(self.which(ids), y)

    def test_3_restart_drops_the_entries(self):
        from kv_fake_publisher import AllBlocksCleared
        self.pubs[0].publish([self.stored(prompt_ids(5), 2, 0x7000)])
        self.wait_for(lambda: self.blocks(0) >= 2, "not indexed")
        restarts = f'pagoda:router_kv_replica_drops_total{{{self.labels[0]},reason="restart"}}'
        r0 = self.kv(restarts)
        self.pubs[0].restart()
        self.pubs[0].publish([AllBlocksCleared()])  # seq 0 again
        self.wait_for(lambda: self.kv(restarts) == r0 + 1, "the restart was not seen")
        self.assertEqual(self.blocks(0) + self.blocks(0, "disk"), 0)
        ids = prompt_ids(3)
        self.pubs[0].publish([self.stored(ids, 4, 0x7100)])  # seq 1: applied after the restart
        self.wait_for(lambda: self.blocks(0) == 4, "the restarted stream was not applied")

    def test_4_killed_replica_is_dropped_within_a_health_interval(self):
        ids = prompt_ids(4)
        self.pubs[1].publish([self.stored(ids, 4, 0x8100)])
        self.wait_for(lambda: self.blocks(1) >= 4, "not indexed")
        self.assertEqual(self.which(ids), 1)
        self.reps[1].proc.send_signal(signal.SIGKILL)
        self.reps[1].proc.wait()
        t0 = time.time()
        # The health round comes within one interval; its GET /health fails at once
        # (connection refused). Slack for a loaded 2-core machine.
        self.wait_for(lambda: self.blocks(1) == 0, "the killed replica's entries stayed", timeout=HEALTH_S + 2)
        print(f"entries dropped {time.time() - t0:.2f} s after the kill (health interval {HEALTH_S} s)")
        self.assertEqual(self.kv(f'pagoda:router_kv_replica_drops_total{{{self.labels[1]},reason="unhealthy"}}'), 1)
        from serverutil import post_json
        for _ in range(3):  # its prompts still succeed, on replica 0
            status, body = post_json(self.router.url + "/v1/completions", dict(prompt=ids, max_tokens=2))
            self.assertEqual(status, 200, body)


class RouterKvFlagsTest(unittest.TestCase):
    def test_bad_kv_flags_are_refused_with_a_message(self):
        import subprocess
        one = ["--replica", "http://127.0.0.1:1", "-m", "none"]
        cases = [(one + ["--kv-events-endpoint", "tcp://127.0.0.1:2"], 2, "need --kv-events"),
                 (one + ["--kv-events", "--kv-events-endpoint", "tcp://a:1,tcp://b:1"], 1,
                  "--kv-events-endpoint is given 2 times for 1 replicas"),
                 (one + ["--kv-events", "--kv-replay-endpoint", "tcp://a:1,tcp://b:1"], 1,
                  "--kv-replay-endpoint is given 2 times for 1 replicas"),
                 (one + ["--kv-events", "--kv-tier-weight", "2"], 2, "--kv-tier-weight must be a number in"),
                 (one + ["--kv-events", "--kv-events-endpoint", "bogus://x"], 1, "--kv-events-endpoint:"),
                 (one + ["--kv-min-match", "2"], 2, "--kv-max-imbalance need --kv-events"),
                 (one + ["--kv-match-threshold", "0.3"], 2, "--kv-max-imbalance need --kv-events"),
                 (one + ["--kv-max-imbalance", "3"], 2, "--kv-max-imbalance need --kv-events"),
                 (one + ["--kv-events", "--kv-max-imbalance", "-1"], 2, "--kv-max-imbalance must be a number in"),
                 (one + ["--kv-events", "--kv-match-threshold", "1.5"], 2, "--kv-match-threshold must be a number in"),
                 (one + ["--kv-events", "--kv-min-match", "0"], 2, "--kv-min-match must be an integer in 1..")]
        for args, rc, msg in cases:
            p = subprocess.run([BINARY, "router", "--port", "0"] + args, capture_output=True, text=True, timeout=30)
            self.assertEqual(p.returncode, rc, (args, p.stderr))
            self.assertIn(msg, p.stderr, args)


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    need("zmq")
    need("msgspec")
    if not os.path.exists(MODEL):
        print(f"{'error' if os.environ.get('CI') == 'true' else 'skipped'}: {MODEL} is missing")
        sys.exit(1 if os.environ.get("CI") == "true" else 77)
    unittest.main(argv=sys.argv[:1] + sys.argv[3:], verbosity=2)
