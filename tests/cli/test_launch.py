"""Issue 20: launch commands copied from vLLM's and llama.cpp's documentation, adapted
to a GGUF path (MODEL), loopback and a free port (PORT = 0), work as given: each
starts and answers one completion, or fails (exit 2) with a message naming the flag.

Sources: vLLM docs (Quickstart "OpenAI-Compatible Server", "Engine Arguments",
"Automatic Prefix Caching", "Security"), llama.cpp tools/server/README.md ("Quick
Start", "Usage", the multi-user and API-key examples), llama.cpp main/README.md.
Usage: test_launch.py PAGODA DATA_DIR
"""
import os
import sys
import tempfile
import unittest
import urllib.error

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Launched  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
TMP = tempfile.mkdtemp(prefix="pagoda_launch_")
KEYS = os.path.join(TMP, "keys.txt")
TEMPLATE = os.path.join(TMP, "template.jinja")
with open(KEYS, "w") as f:
    f.write("# one key per line\nsk-file-key\n")
with open(TEMPLATE, "w") as f:
    f.write("{% for m in messages %}{{ m['content'] }}\n{% endfor %}")

RUNS = "runs"  # a one-shot command: exits 0 with the generated text

# (origin, command as documented with MODEL/PORT substituted, expectation)
# expectation: None = starts and answers; RUNS = exits 0 with 16 tokens; another
# string = exits 2 naming that flag. Each `vllm serve` and `llama-server` is
# `pagoda serve`, each `llama-cli` is `pagoda run`.
TABLE = [
    ("vLLM quickstart: vllm serve MODEL",
     ["serve", MODEL, "--port", "0"], None),
    ("vLLM: vllm serve MODEL --gpu-memory-utilization 0.5 --max-model-len 2048 (0.05 here: a shared test machine)",
     ["serve", MODEL, "--port", "0", "--gpu-memory-utilization", "0.05", "--max-model-len", "2048"], None),
    ("vLLM server docs: vllm serve MODEL --dtype auto --api-key token-abc123",
     ["serve", MODEL, "--port", "0", "--dtype", "auto", "--api-key", "token-abc123"], None),
    ("vLLM: vllm serve MODEL --seed 0 --served-model-name my-model",
     ["serve", MODEL, "--port", "0", "--seed", "0", "--served-model-name", "my-model"], None),
    ("vLLM: vllm serve MODEL --tensor-parallel-size 1 --enforce-eager",
     ["serve", MODEL, "--port", "0", "--tensor-parallel-size", "1", "--enforce-eager"], None),
    ("vLLM APC: vllm serve MODEL --enable-prefix-caching --max-num-seqs 8 --max-num-batched-tokens 512",
     ["serve", MODEL, "--port", "0", "--enable-prefix-caching", "--max-num-seqs", "8",
      "--max-num-batched-tokens", "512"], None),
    ("vLLM: vllm serve MODEL --chat-template ./template.jinja --allowed-origins '[\"*\"]' --disable-log-requests",
     ["serve", MODEL, "--port", "0", "--chat-template", TEMPLATE, "--allowed-origins", '["*"]',
      "--disable-log-requests"], None),
    ("vLLM: vllm serve MODEL --tensor-parallel-size 4",
     ["serve", MODEL, "--port", "0", "--tensor-parallel-size", "4"], "--tensor-parallel-size"),
    ("vLLM: vllm serve MODEL --kv-cache-dtype fp8",
     ["serve", MODEL, "--port", "0", "--kv-cache-dtype", "fp8"], "--kv-cache-dtype"),
    ("llama.cpp server: llama-server -m MODEL -c 2048 -ngl 99 -fa --port 8080",
     ["serve", "-m", MODEL, "-c", "2048", "-ngl", "99", "-fa", "--port", "0"], None),
    ("llama.cpp server: llama-server -m MODEL -c 2048 --host 127.0.0.1 --port 8080",
     ["serve", "-m", MODEL, "-c", "2048", "--host", "127.0.0.1", "--port", "0"], None),
    ("llama.cpp server (multi-user): llama-server -m MODEL -c 2048 -np 4 -cb",
     ["serve", "-m", MODEL, "-c", "2048", "-np", "4", "-cb", "--port", "0"], None),
    ("llama.cpp server: llama-server -m MODEL --api-key-file keys.txt",
     ["serve", "-m", MODEL, "--api-key-file", KEYS, "--port", "0"], None),
    ("llama.cpp server: llama-server -m MODEL -a my-alias --jinja --metrics -t 2",
     ["serve", "-m", MODEL, "-a", "my-alias", "--jinja", "--metrics", "-t", "2", "--port", "0"], None),
    ("llama.cpp server: llama-server -m MODEL -ctk q8_0 -ctv q8_0 --n-gpu-layers 35 --flash-attn on --seed -1",
     ["serve", "-m", MODEL, "-ctk", "q8_0", "-ctv", "q8_0", "--n-gpu-layers", "35", "--flash-attn", "on",
      "--seed", "-1", "--port", "0"], None),
    ("llama.cpp server: llama-server -m MODEL --lora adapter.gguf",
     ["serve", "-m", MODEL, "--lora", "adapter.gguf", "--port", "0"], "--lora"),
    ("llama.cpp main: llama-cli -m MODEL -p \"Once upon a time\" -n 16 --seed 42 -c 512 -ngl 99 --temp 0",
     ["run", "-m", MODEL, "-p", "Once upon a time", "-n", "16", "--seed", "42", "-c", "512", "-ngl", "99",
      "--temp", "0"], RUNS),
    ("llama.cpp main: llama-cli -m MODEL -p PROMPT -n 16 -fa on -t 2 -ctk q8_0 -ctv q8_0 (positional model here)",
     ["run", MODEL, "-p", "Once upon a time", "-n", "16", "-fa", "on", "-t", "2", "-ctk", "q8_0", "-ctv", "q8_0"],
     RUNS),
    ("llama.cpp main: llama-cli -m MODEL -p PROMPT --mirostat 2",
     ["run", "-m", MODEL, "-p", "Once upon a time", "--mirostat", "2"], "--mirostat"),
    ("pagoda: pagoda serve MODEL --log-level debug -v",
     ["serve", MODEL, "--log-level", "debug", "-v", "--port", "0"], None),
    ("pagoda: pagoda serve MODEL --log-level loud",
     ["serve", MODEL, "--log-level", "loud", "--port", "0"], "--log-level"),
]


class LaunchCommands(unittest.TestCase):
    def test_table(self):
        self.assertGreaterEqual(len(TABLE), 12)
        for origin, args, fails_on in TABLE:
            with self.subTest(origin):
                srv = Launched(BINARY, args + ([] if args[0] == "run" else ["--log-stats-interval", "0"]))
                try:
                    if fails_on == RUNS:
                        self.assertEqual(srv.rc, 0, srv.text())
                        self.assertIn("generated tokens: 16", srv.text())
                        self.assertTrue(srv.out.strip(), "no text on stdout")
                        continue
                    if fails_on:
                        self.assertIsNone(srv.port, "started, but should fail on " + fails_on)
                        self.assertEqual(srv.rc, 2, srv.text())
                        self.assertIn(fails_on, srv.text())
                        continue
                    self.assertIsNotNone(srv.port, srv.text())
                    headers = {}
                    if "--api-key" in args:
                        headers["Authorization"] = "Bearer token-abc123"
                    if "--api-key-file" in args:
                        headers["Authorization"] = "Bearer sk-file-key"
                    r = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 4,
                                                     "temperature": 0}, headers)
                    self.assertEqual(r["usage"]["completion_tokens"], 4)
                    if "my-model" in args:
                        self.assertEqual(r["model"], "my-model")
                    if "my-alias" in args:
                        self.assertEqual(r["model"], "my-alias")
                    # Flags that only exist on GPUs warn once each, on one line.
                    if "-ngl" in args:
                        self.assertEqual(srv.text().count("-ngl 99: pagoda runs on the CPU"), 1)
                    if "--gpu-memory-utilization" in args:
                        # The KV pool is sized from the fraction: F x RAM minus the model file.
                        self.assertRegex(srv.text(), r"--gpu-memory-utilization 0\.05: .* RAM for weights \(1\.13 MiB\)"
                                                     r" \+ KV cache \(")
                    if headers:  # a key is required: none is refused
                        with self.assertRaises(urllib.error.HTTPError) as e:
                            srv.post("/v1/completions", {"prompt": "x", "max_tokens": 1})
                        self.assertEqual(e.exception.code, 401)
                finally:
                    srv.stop()

    def test_version_and_unknown_flag(self):
        for args in (["--version"], ["-V"], ["serve", "--version"]):
            srv = Launched(BINARY, args)
            self.assertEqual(srv.rc, 0)
            self.assertRegex(srv.out, r"^pagoda \d+\.\d+\.\d+ \(commit ")
        srv = Launched(BINARY, ["serve", MODEL, "--no-such-flag", "3"])
        self.assertEqual(srv.rc, 2)
        self.assertIn("unknown flag --no-such-flag", srv.text())
        srv = Launched(BINARY, ["serve", MODEL, "other.gguf"])
        self.assertEqual(srv.rc, 2)
        self.assertIn("unexpected argument 'other.gguf'", srv.text())

    def test_seed_makes_unseeded_requests_repeat(self):
        # --seed: a restarted server answers the same unseeded sampled requests alike.
        runs = []
        for _ in range(2):
            srv = Launched(BINARY, ["serve", MODEL, "--port", "0", "--seed", "7", "--log-stats-interval", "0"])
            try:
                runs.append([srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 12,
                                                          "temperature": 1.0})["choices"][0]["text"]
                             for _ in range(2)])
            finally:
                srv.stop()
        self.assertEqual(runs[0], runs[1])
        self.assertNotEqual(runs[0][0], runs[0][1])  # each request draws its own seed

    def test_serve_threads_default_all_cores(self):
        srv = Launched(BINARY, ["serve", MODEL, "--port", "0"])
        try:
            self.assertIn(f", {os.cpu_count()} threads", srv.text())
        finally:
            srv.stop()


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
