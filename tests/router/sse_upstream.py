"""A replica stand-in on asyncio for router tests and benchmarks: HTTP/1.1 with
keep-alive, GET /health, and POST /v1/completions answering a streamed request
with `events` SSE events (each naming the prompt, the replica and its index)
and [DONE] over chunked encoding, or a non-streamed request with one JSON body.

A stream may be held after its first event until `release` (an asyncio.Event)
is set: that is how a test keeps 1,000 streams open through the router at once.
With hold_prefix only streams whose prompt starts with it are held, and with
tick > 0 a held stream sends an SSE comment line every tick seconds meanwhile
(bench/router_ttft.py: probes timed beside busy background streams).
Every counter is touched on the one asyncio thread.
"""
import asyncio
import json


def event_text(prompt, name, k):
    return "%s|%s|%d" % (prompt, name, k)


def expected_events(prompt, name, events):
    return [event_text(prompt, name, k) for k in range(events)]


def parse_sse(data):
    """Bytes of an SSE body -> (texts of its events, whether it ended with [DONE])."""
    texts, done = [], False
    for block in data.decode().split("\n\n"):
        if not block or block.startswith(":"):
            continue  # an SSE comment (a stand-in's tick)
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        if payload == "[DONE]":
            done = True
            continue
        assert not done, "an event after [DONE]"
        texts.append(json.loads(payload)["choices"][0]["text"])
    return texts, done


class SseUpstream:
    def __init__(self, name, events=3, release=None, on_open=None, hold_prefix=None, tick=0):
        self.name, self.events, self.release, self.on_open = name, events, release, on_open
        self.hold_prefix, self.tick = hold_prefix, tick
        self.open_streams = 0
        self.connections = 0
        self.requests = 0
        self.server = None
        self.port = None

    async def start(self):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0, backlog=4096)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    async def close(self):
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader, writer):
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ", 2)
                headers = {}
                for ln in lines[1:]:
                    if ln:
                        k, v = ln.split(":", 1)
                        headers[k.strip().lower()] = v.strip()
                n = int(headers.get("content-length", "0"))
                body = await reader.readexactly(n) if n else b""
                self.requests += 1
                if target == "/health":
                    self._send(writer, 200, b'{"status":"ok"}')
                elif method == "POST" and target == "/v1/completions":
                    req = json.loads(body)
                    if req.get("stream"):
                        await self._stream(writer, str(req["prompt"]))
                    else:
                        text = event_text(req["prompt"], self.name, 0)
                        self._send(writer, 200, json.dumps({"choices": [{"index": 0, "text": text}]}).encode())
                else:
                    self._send(writer, 404, b'{"error":{"message":"no route"}}')
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError, asyncio.CancelledError):
            pass  # the client went away, or close() ended an idle kept-alive connection
        finally:
            writer.close()

    def _send(self, writer, status, body):
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" %
                     (status, len(body)) + body)

    async def _stream(self, writer, prompt):
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        self.open_streams += 1
        try:
            for k in range(self.events):
                if k == 1 and (self.hold_prefix is None or prompt.startswith(self.hold_prefix)):
                    if self.on_open:
                        self.on_open()
                    while self.release is not None and not self.release.is_set():
                        if self.tick <= 0:
                            await self.release.wait()
                            break
                        try:
                            await asyncio.wait_for(self.release.wait(), self.tick)
                        except asyncio.TimeoutError:
                            writer.write(b"8\r\n: tick\n\n\r\n")
                            await writer.drain()
                ev = ("data: " + json.dumps({"choices": [{"index": 0, "text": event_text(prompt, self.name, k)}]}) +
                      "\n\n").encode()
                writer.write(b"%x\r\n" % len(ev) + ev + b"\r\n")
                await writer.drain()
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n" % len(done) + done + b"\r\n0\r\n\r\n")
        finally:
            self.open_streams -= 1


async def stream_request(port, prompt, timeout=120, on_first=None):
    """POST a streamed completion to 127.0.0.1:port; (status, body bytes). on_first()
    is called when the first body byte arrives (TTFT)."""
    r, w = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
    try:
        body = json.dumps({"model": "m", "prompt": prompt, "max_tokens": 3, "stream": True}).encode()
        w.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body) + body)
        await w.drain()
        head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), timeout)
        status = int(head.split(b" ", 2)[1])
        hl = head.lower()
        data = b""
        if b"transfer-encoding: chunked" in hl:
            while True:
                size = int((await asyncio.wait_for(r.readuntil(b"\r\n"), timeout)).strip(), 16)
                if size == 0:
                    await r.readuntil(b"\r\n")
                    break
                chunk = await asyncio.wait_for(r.readexactly(size), timeout)
                if not data and on_first:
                    on_first()
                data += chunk
                await r.readexactly(2)
        else:
            n = int([ln.split(b":", 1)[1] for ln in hl.split(b"\r\n") if ln.startswith(b"content-length:")][0])
            data = await asyncio.wait_for(r.readexactly(n), timeout)
        return status, data
    finally:
        w.close()
