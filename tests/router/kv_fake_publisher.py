"""A stand-in for a replica's KV event publisher (issue 37), written from vLLM's
published event types (vllm/distributed/kv_events.py: msgspec Structs, array_like,
tagged) and its ZmqEventPublisher: a PUB socket sending [topic, seq (8-byte
big-endian), payload] and a ROUTER replay socket answering [b"", start_seq] with
[b"", seq, payload]... then [b"", -1, b""] from a bounded buffer.

Used by tests/router/test_router_kv.py (until the engine's own publisher lands)
and importable by anything that needs a scripted event stream.
"""
import threading
import time
from typing import Any, Optional, Union

import msgspec
import zmq


class EventBatch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    data_parallel_rank: Optional[int] = None


class KVCacheEvent(msgspec.Struct, array_like=True, gc=False, tag=True):
    """Base class: with tag=True, the class name is each event's first element."""


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: Optional[int]
    token_ids: list[int]
    block_size: int
    lora_id: Optional[int] = None
    medium: Optional[str] = "cpu"
    lora_name: Optional[str] = None
    extra_keys: Optional[list[Any]] = None
    group_idx: int = 0


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: Optional[str] = "cpu"
    group_idx: int = 0


class AllBlocksCleared(KVCacheEvent):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]
END_SEQ = (-1).to_bytes(8, "big", signed=True)


class FakePublisher:
    """Binds a PUB and a ROUTER socket on free loopback ports (self.endpoint,
    self.replay_endpoint); publish() sends one batch, or only buffers it (drop=True:
    a message the subscriber misses, to be found through the replay socket)."""

    def __init__(self, topic=b"kv-events", buffer_steps=10000):
        self.ctx = zmq.Context()
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        rport = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.replay_endpoint = f"tcp://127.0.0.1:{rport}"
        self.topic = topic
        self.buffer_steps = buffer_steps
        self.enc = msgspec.msgpack.Encoder()
        self.lock = threading.Lock()
        self.seq = 0
        self.buffer = []  # (seq, payload)
        self.replays = 0
        self.stopping = False
        self.thread = threading.Thread(target=self._serve_replay, daemon=True)
        self.thread.start()

    def publish(self, events, drop=False):
        with self.lock:
            seq = self.seq
            self.seq += 1
            payload = self.enc.encode(EventBatch(ts=time.time(), events=list(events), data_parallel_rank=0))
            self.buffer.append((seq, payload))
            del self.buffer[:-self.buffer_steps]
            if not drop:
                self.pub.send_multipart([self.topic, seq.to_bytes(8, "big"), payload])
        return seq

    def restart(self):
        """A new engine process: its sequence starts at 0 again, its buffer empty."""
        with self.lock:
            self.seq = 0
            self.buffer = []

    def _serve_replay(self):
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self.stopping:
            if not poller.poll(50):
                continue
            ident, empty, start = self.router.recv_multipart()
            start = int.from_bytes(start, "big")
            with self.lock:
                self.replays += 1
                for seq, payload in self.buffer:
                    if seq >= start:
                        self.router.send_multipart([ident, b"", seq.to_bytes(8, "big"), payload])
                self.router.send_multipart([ident, b"", END_SEQ, b""])

    def close(self):
        self.stopping = True
        self.thread.join(timeout=5)
        self.pub.close()
        self.router.close()
        self.ctx.term()
