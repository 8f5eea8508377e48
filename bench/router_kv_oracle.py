#!/usr/bin/env python3
"""What routing can gain on bench/router_kv_events.py's workloads, without the
engine: the same request sequence (its `workload()`), one request at a time, each
replica an LRU cache of --num-kv-blocks blocks of 16 tokens holding the chain of
every prompt it served (the running request's own blocks and the engine's
eviction details are not modeled). Prints the token hit rate of

- ring:   the hash ring's owner of the prompt's first 8 blocks (no load bound);
- events: the replica holding the longest prefix, ties and matches under
          --kv-match-threshold going by the ring from the first block past the
          match (choose_kv's rules, with a perfect index).

On the issue's plain workload (no shared head) the two are equal: the ring's key
already names a prefix's only home, so no router can gain hit rate there; with a
shared system prompt (--shared-head) the ring sends every prompt to the head's
owner and events spread them.

Usage: bench/router_kv_oracle.py [--num-kv-blocks 160 ...] [--shared-head 8 --heads 1]
       [--kv-match-threshold 0.5]
"""
import argparse
import hashlib
import os
import sys
from collections import OrderedDict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from router_kv_events import BS, add_workload_args, workload  # noqa: E402


def chain(p):
    keys, h = [], b""
    for b in range(len(p) // BS):
        h = hashlib.blake2b(h + repr(p[b * BS:(b + 1) * BS]).encode(), digest_size=8).digest()
        keys.append(h)
    return keys


class Lru:
    def __init__(self, cap):
        self.cap, self.d = cap, OrderedDict()

    def match(self, ch):
        n = 0
        for h in ch:
            if h not in self.d:
                break
            n += 1
        return n

    def insert(self, ch):
        for h in ch:
            self.d[h] = True
            self.d.move_to_end(h)
        while len(self.d) > self.cap:
            self.d.popitem(last=False)


def owner(key, n):
    return int.from_bytes(key[:4], "little") % n


def run(args, prompts, events):
    caches = [Lru(args.num_kv_blocks) for _ in range(args.replicas)]
    hit = tot = 0
    for p in prompts:
        ch = chain(p)
        r = owner(ch[min(7, len(ch) - 1)], args.replicas)
        if events:
            ms = [c.match(ch) for c in caches]
            m = max(ms)
            past = ch[min(m, len(ch) - 1)]
            if m > 0 and m >= args.kv_match_threshold * len(ch):
                holders = [i for i in range(args.replicas) if ms[i] == m]
                r = holders[owner(past, len(holders))]
            elif m > 0:
                r = owner(past, args.replicas)
        hit += caches[r].match(ch) * BS
        tot += len(p)
        caches[r].insert(ch)
    return hit / tot


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_workload_args(ap)
    ap.add_argument("--kv-match-threshold", type=float, default=0.5)
    args = ap.parse_args()
    prompts = workload(args)
    ring, ev = run(args, prompts, False), run(args, prompts, True)
    print(f"ring {100 * ring:.1f} %  events {100 * ev:.1f} %  ({100 * (ev - ring):+.1f} points)")


if __name__ == "__main__":
    main()
