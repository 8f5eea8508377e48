#!/usr/bin/env python3
"""The dashboard under per-key cache salts (issue 35, item 1): no tenant reads
another's prompts.

usage: test_dashboard_tenants.py PAGODA_BINARY TEST_DATA_DIR

One `pagoda serve --api-key K1,K2 --prefix-cache-salt-per-key --dashboard-admin-key
ADMIN` on stories260K. K1 and K2 each send prompts of their own words; then, for
each key, every block id of the pool is fetched from /dashboard/block:
  - K2 reads the text of its own cached blocks and never a word of K1's prompts
    (and K1 never one of K2's); another tenant's block answers exactly like a
    block that holds nothing (404);
  - /dashboard/snapshot and the first /dashboard/events event show K2 only its own
    prefix tree (the very blocks it can read) and no request of K1's;
  - the admin key sees every tenant's blocks; it opens no API route.
"""
import json
import os
import sys
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from serverutil import OneServerPerClass  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
K1, K2, ADMIN = "tenant-one-key", "tenant-two-key", "dashboard-admin"
NUM_BLOCKS = 96  # --num-kv-blocks
# Words of stories260K's vocabulary, different for each tenant.
K1_PROMPTS = ["The little cat was very happy. The cat liked to play with the ball in the garden every day. "
              "The cat ran after the ball and the cat was happy in the garden.",
              "The cat and the dog went to the park. The cat saw a big tree and the dog saw a bird. "
              "The dog and the cat played in the park all day."]
K2_PROMPTS = ["Lily had a red car. Lily wanted to drive the car to the sea with her mom and dad today. "
              "Lily and her car went to the sea and Lily was glad.",
              "Tom found a shiny box. Tom opened the box and there was a toy boat inside for Tom. "
              "Tom put the boat in the box and Tom smiled."]
K1_WORDS, K2_WORDS = {"cat", "dog", "ball", "garden", "park"}, {"Lily", "car", "sea", "Tom", "box", "boat"}


def call(port, method, path, key, body=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method,
                                 data=json.dumps(body).encode() if body is not None else None,
                                 headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Tenants(OneServerPerClass, unittest.TestCase):
    SERVER = None

    @classmethod
    def setUpClass(cls):
        cls.SERVER = (BINARY, os.path.join(DATA, "stories260K.gguf"),
                      ["--api-key", f"{K1},{K2}", "--prefix-cache-salt-per-key", "--dashboard-admin-key", ADMIN,
                       "--num-kv-blocks", str(NUM_BLOCKS)])
        super().setUpClass()
        for key, prompts in ((K1, K1_PROMPTS), (K2, K2_PROMPTS)):
            for p in prompts:
                st, body = call(cls.srv.port, "POST", "/v1/completions", key,
                                {"prompt": p, "max_tokens": 2, "temperature": 0})
                assert st == 200, body

    def blocks(self, key):
        """{block id: text} of every block id `key` may read; every other id is a 404."""
        out = {}
        for b in range(1, NUM_BLOCKS):
            st, body = call(self.srv.port, "GET", f"/dashboard/block?id={b}", key)
            self.assertIn(st, (200, 404), body[:200])
            j = json.loads(body)
            if st == 200:
                out[b] = j["text"]
            else:
                self.assertEqual(j["error"]["message"], f"block {b} holds no cached prefix")
        return out

    def test_block_walk_finds_no_other_tenant_text(self):
        mine1, mine2, admin = self.blocks(K1), self.blocks(K2), self.blocks(ADMIN)
        self.assertGreaterEqual(len(mine1), 4)  # two prompts of two or more full 16-token blocks each
        self.assertGreaterEqual(len(mine2), 4)
        self.assertEqual(set(mine1) & set(mine2), set())
        self.assertEqual(admin, {**mine1, **mine2})  # the admin sees every tenant, nothing else is cached
        text1, text2 = " ".join(mine1.values()), " ".join(mine2.values())
        for w in K1_WORDS:
            self.assertNotIn(w, text2)
        for w in K2_WORDS:
            self.assertNotIn(w, text1)
        self.assertTrue(any(w in text1 for w in K1_WORDS), text1)
        self.assertTrue(any(w in text2 for w in K2_WORDS), text2)

    def test_snapshot_and_events_show_only_own_tree(self):
        mine2 = self.blocks(K2)
        st, body = call(self.srv.port, "GET", "/dashboard/snapshot", K2)
        self.assertEqual(st, 200)
        snap = json.loads(body)
        self.assertEqual({n[0] for n in snap["prefix"]["nodes"]}, set(mine2))
        self.assertEqual(snap["prefix"]["cached_blocks"], len(mine2))
        self.assertEqual(snap["requests"], [])
        st, body = call(self.srv.port, "GET", "/dashboard/snapshot", ADMIN)
        self.assertEqual(len(json.loads(body)["prefix"]["nodes"]), len(self.blocks(ADMIN)))
        # The event stream, as a browser opens it (?key=), carries the same tenant view.
        with urllib.request.urlopen(f"http://127.0.0.1:{self.srv.port}/dashboard/events?hz=10&key={K2}",
                                    timeout=30) as r:
            data = b""
            while b"\n\n" not in data:
                data += r.read1(65536)
        event = json.loads(data.split(b"data: ", 1)[1].split(b"\n\n", 1)[0])
        self.assertEqual({n[0] for n in event["prefix"]["nodes"]}, set(mine2))

    def test_admin_key_opens_only_the_dashboard(self):
        st, _ = call(self.srv.port, "POST", "/v1/completions", ADMIN, {"prompt": "Hi", "max_tokens": 1})
        self.assertEqual(st, 401)
        st, _ = call(self.srv.port, "GET", "/dashboard/snapshot", "wrong-key")
        self.assertEqual(st, 401)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
