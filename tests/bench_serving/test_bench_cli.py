"""`pagoda bench` as llama-bench and `vllm bench serve` are used, end to end on stories260K:
llama-bench's output formats parsed back with its field names, vLLM's --save-result JSON
against a real `pagoda serve` (completions and chat), errors that name the flag, and the
progress line (only on a terminal).

Usage: test_bench_cli.py PAGODA_BINARY TESTS_DATA_DIR
"""
import csv
import glob
import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "server"))
from serverutil import PagodaServer  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
STORIES = os.path.join(DATA, "stories260K.gguf")
SHAREGPT = os.path.join(DATA, "sharegpt_sample.json")

# llama.cpp tools/llama-bench: test::get_fields(), then the json printers' samples.
LLAMA_BENCH_FIELDS = [
    "build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename", "model_type",
    "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads", "cpu_mask", "cpu_strict", "poll",
    "type_k", "type_v", "n_gpu_layers", "n_cpu_moe", "split_mode", "main_gpu", "no_kv_offload", "flash_attn",
    "devices", "tensor_split", "tensor_buft_overrides", "load_mode", "lazy_mode", "embeddings", "no_op_offload",
    "no_host", "repack", "fit_target", "fit_min_ctx", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns",
    "stddev_ns", "avg_ts", "stddev_ts"]
PAGODA_FIELDS = ["weight_bytes_per_token", "weight_gb_per_s", "read_gb_per_s", "read_bw_fraction", "tokens_hash",
                 "tokens_consistent"]


def bench(*args, timeout=300):
    return subprocess.run([BINARY, "bench", *args], capture_output=True, text=True, timeout=timeout)


class LlamaBenchOutput(unittest.TestCase):
    BASE = ["-m", STORIES, "-p", "8,16", "-n", "4", "-t", "1,2", "-r", "2", "--no-bandwidth"]
    # The cross product in llama-bench's order: threads outer, then pp tests, then tg.
    ORDER = [(1, 8, 0), (1, 16, 0), (1, 0, 4), (2, 8, 0), (2, 16, 0), (2, 0, 4)]

    def check_records(self, recs):
        self.assertEqual([(r["n_threads"], r["n_prompt"], r["n_gen"]) for r in recs], self.ORDER)
        for r in recs:
            self.assertEqual(list(r.keys()), LLAMA_BENCH_FIELDS + ["samples_ns", "samples_ts"] + PAGODA_FIELDS)
            self.assertEqual(r["model_filename"], STORIES)
            self.assertEqual(r["backends"], "CPU")
            self.assertEqual(len(r["samples_ns"]), 2)
            self.assertLessEqual(abs(r["avg_ns"] - sum(r["samples_ns"]) / 2), 0.5)
            n = r["n_prompt"] + r["n_gen"]
            ts = [1e9 * n / ns for ns in r["samples_ns"]]
            self.assertAlmostEqual(r["avg_ts"], sum(ts) / 2, delta=1e-3 * r["avg_ts"])
            self.assertGreater(r["avg_ts"], 0)
            self.assertEqual(r["tokens_hash"] != "", r["n_prompt"] == 0)

    def test_jsonl_and_json(self):
        p = bench(*self.BASE, "-o", "jsonl")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_records([json.loads(line) for line in p.stdout.splitlines()])
        p = bench(*self.BASE, "-o", "json")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.check_records(json.loads(p.stdout))

    def test_csv_and_md(self):
        p = bench(*self.BASE, "-o", "csv")
        self.assertEqual(p.returncode, 0, p.stderr)
        rows = list(csv.DictReader(io.StringIO(p.stdout)))
        self.assertEqual(list(rows[0].keys()), LLAMA_BENCH_FIELDS + PAGODA_FIELDS)
        self.assertEqual([(int(r["n_threads"]), int(r["n_prompt"]), int(r["n_gen"])) for r in rows], self.ORDER)
        p = bench(*self.BASE, "-o", "md")
        self.assertEqual(p.returncode, 0, p.stderr)
        lines = p.stdout.splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        self.assertEqual(header, ["model", "size", "params", "backend", "threads", "test", "t/s"])
        tests = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:8]]
        self.assertEqual([(int(t[4]), t[5]) for t in tests],
                         [(1, "pp8"), (1, "pp16"), (1, "tg4"), (2, "pp8"), (2, "pp16"), (2, "tg4")])
        for t in tests:
            self.assertRegex(t[6], r"^\d+\.\d\d ± \d+\.\d\d$")
        self.assertTrue(any(line.startswith("build: ") for line in lines))

    def test_pg_and_legacy_json(self):
        p = bench("-m", STORIES, "-p", "0", "-n", "0", "-pg", "8,4", "-r", "1", "-t", "1", "-o", "jsonl")
        self.assertEqual(p.returncode, 0, p.stderr)
        (rec,) = [json.loads(line) for line in p.stdout.splitlines()]
        self.assertEqual((rec["n_prompt"], rec["n_gen"]), (8, 4))
        # -d: the depth is computed once and served by the prefix cache; the test names it.
        p = bench("-m", STORIES, "-p", "8", "-n", "4", "-d", "32", "-r", "2", "-t", "1", "--no-bandwidth")
        self.assertEqual(p.returncode, 0, p.stderr)
        tests = [line.split("|")[6].strip() for line in p.stdout.splitlines()[2:4]]
        self.assertEqual(tests, ["pp8 @ d32", "tg4 @ d32"])
        # pagoda's earlier flags and summary object still work.
        p = bench("-m", STORIES, "--pp", "8", "--tg", "4", "-r", "1", "-t", "1", "--json", "--no-bandwidth")
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        self.assertEqual((j["pp_tokens"], j["tg_tokens"]), (8, 4))
        self.assertGreater(j["tg_tokens_per_s"], 0)
        self.assertTrue(j["tg_tokens_consistent"])


class BadValues(unittest.TestCase):
    def test_errors_name_the_flag(self):
        for args, flag in [(["-p", "x"], "-p"), (["-o", "sql"], "-o"), (["-pg", "3"], "-pg"), (["-t", "0"], "-t"),
                           (["--dataset-name", "sonnet"], "--dataset-name"),
                           (["--dataset-name", "sharegpt"], "--dataset-path"),
                           (["--dataset-name", "random", "--endpoint", "/v2/x"], "--endpoint"),
                           (["--dataset-name", "random", "--metric-percentiles", "a"], "--metric-percentiles"),
                           (["--dataset-name", "random", "--percentile-metrics", "x"], "--percentile-metrics")]:
            p = bench("-m", STORIES, *args, timeout=30)
            self.assertEqual(p.returncode, 2, (args, p.stderr))
            self.assertIn(flag, p.stderr, args)
            self.assertEqual(p.stdout, "")


class SaveResult(unittest.TestCase):
    """vLLM's --save-result against a real `pagoda serve` on stories260K."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        template = os.path.join(cls.tmp.name, "chat.jinja")
        with open(template, "w") as f:  # stories260K has no chat template of its own
            f.write("{% for m in messages %}{{ m['content'] }}{% endfor %}")
        cls.srv = PagodaServer(BINARY, STORIES, ["-t", "1", "--chat-template", template]).__enter__()

    @classmethod
    def tearDownClass(cls):
        cls.srv.__exit__(None, None, None)
        cls.tmp.cleanup()

    def run_bench(self, *args):
        p = bench(*args)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertNotIn("\r", p.stdout)  # no progress line in a pipe
        return p

    def test_random_completions(self):
        out = os.path.join(self.tmp.name, "random")
        self.run_bench("--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "8",
                       "--num-prompts", "6", "--max-concurrency", "3", "--base-url", self.srv.url,
                       "--model", "stories260K", "--tokenizer", STORIES, "--save-result", "--result-dir", out,
                       "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99")
        (path,) = glob.glob(os.path.join(out, "openai-infqps-concurrency3-stories260K-*.json"))
        with open(path) as f:
            j = json.load(f)
        for k in ["date", "backend", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
                  "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                  "request_throughput", "output_throughput", "total_token_throughput", "max_output_tokens_per_s",
                  "max_concurrent_requests"]:
            self.assertIn(k, j)
        self.assertEqual((j["model_id"], j["backend"], j["num_prompts"]), ("stories260K", "openai", 6))
        self.assertEqual((j["request_rate"], j["max_concurrency"]), ("inf", 3))
        self.assertEqual((j["completed"], j["failed"]), (6, 0))
        self.assertEqual(j["total_input_tokens"], 6 * 16)
        self.assertEqual(j["total_output_tokens"], 6 * 8)  # random prompts ignore EOS, as in vLLM
        self.assertGreater(j["duration"], 0)
        self.assertAlmostEqual(j["request_throughput"], 6 / j["duration"], places=6)
        self.assertAlmostEqual(j["output_throughput"], 48 / j["duration"], places=6)
        self.assertGreaterEqual(j["max_output_tokens_per_s"], 1)
        self.assertLessEqual(j["max_output_tokens_per_s"], 48)
        self.assertTrue(1 <= j["max_concurrent_requests"] <= 6)
        for m in ["ttft", "tpot", "itl", "e2el"]:
            v = [j[f"{s}_{m}_ms"] for s in ["mean", "median", "std", "p50", "p90", "p99"]]
            self.assertTrue(all(x >= 0 for x in v), (m, v))
            self.assertEqual(j[f"median_{m}_ms"], j[f"p50_{m}_ms"])
            self.assertLessEqual(j[f"p50_{m}_ms"], j[f"p90_{m}_ms"])
            self.assertLessEqual(j[f"p90_{m}_ms"], j[f"p99_{m}_ms"])
        self.assertGreater(j["mean_ttft_ms"], 0)
        self.assertLessEqual(j["mean_ttft_ms"], j["mean_e2el_ms"])
        self.assertIsNotNone(j["prefix_hit_rate"])

    def test_sharegpt_chat(self):
        out = os.path.join(self.tmp.name, "chat")
        p = self.run_bench("--backend", "openai-chat", "--dataset-name", "sharegpt", "--dataset-path", SHAREGPT,
                           "--num-prompts", "4", "--sharegpt-output-len", "6", "--ignore-eos",
                           "--host", "127.0.0.1", "--port", str(self.srv.port), "-m", STORIES,
                           "--save-result", "--save-detailed", "--result-dir", out, "--result-filename", "c.json")
        self.assertIn("Successful requests:                     4", p.stdout)
        with open(os.path.join(out, "c.json")) as f:
            j = json.load(f)
        self.assertEqual((j["backend"], j["completed"], j["failed"]), ("openai-chat", 4, 0))
        self.assertEqual(j["output_lens"], [6, 6, 6, 6])
        self.assertEqual(j["total_output_tokens"], 24)
        self.assertEqual(len(j["generated_texts"]), 4)
        self.assertTrue(all(t for t in j["generated_texts"]))
        self.assertEqual(j["errors"], ["", "", "", ""])
        self.assertEqual(len(j["ttfts"]), 4)


class AppendResult(unittest.TestCase):
    def test_append_adds_a_line(self):
        with tempfile.TemporaryDirectory() as d:
            args = ["-m", STORIES, "-t", "1", "--dataset-name", "random", "--num-prompts", "2",
                    "--random-input-len", "8", "--random-output-len", "2", "--result-dir", d,
                    "--result-filename", "r.json"]
            for flag in ["--save-result", "--append-result", "--append-result"]:
                p = bench(*args, flag)
                self.assertEqual(p.returncode, 0, p.stderr)
            with open(os.path.join(d, "r.json")) as f:
                lines = f.read().splitlines()
            self.assertEqual(len(lines), 3)
            for line in lines:
                j = json.loads(line)
                self.assertEqual((j["backend"], j["completed"], j["total_output_tokens"]), ("offline", 2, 4))


class SavePrompts(unittest.TestCase):
    def test_copy_workload_messages(self):
        """--save-prompts writes the copy workload's chat messages (--dataset lines) and runs nothing;
        the same seed gives the same lines, each asking to repeat its fenced block renamed."""
        with tempfile.TemporaryDirectory() as d:
            runs = []
            for name in ["a.jsonl", "b.jsonl"]:
                path = os.path.join(d, name)
                p = bench("-m", STORIES, "--workload", "copy", "--num-prompts", "3", "--output-len", "50",
                          "--seed", "4", "--save-prompts", path)
                self.assertEqual(p.returncode, 0, p.stderr)
                self.assertEqual(p.stdout, "")  # no run, no report
                with open(path) as f:
                    runs.append([json.loads(line) for line in f])
            self.assertEqual(runs[0], runs[1])
            self.assertEqual(len(runs[0]), 3)
            for r in runs[0]:
                self.assertEqual(r["max_tokens"], 50)
                ask, block = r["prompt"].split("```python\n")
                name = block.split(" ", 1)[0]
                self.assertIn(f"rename `{name}` to `{name}_v2`", ask)
                self.assertTrue(block.endswith("```\n") and block.count("\n") >= 5, block)
            self.assertEqual(len({r["prompt"] for r in runs[0]}), 3)

    def test_copy_long_workload_messages(self):
        """--workload copy-long: the same request over a dict of 16 distinct keys with integer values."""
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "a.jsonl")
            p = bench("-m", STORIES, "--workload", "copy-long", "--num-prompts", "4", "--output-len", "200",
                      "--seed", "4", "--save-prompts", path)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(path) as f:
                rows = [json.loads(line) for line in f]
            self.assertEqual(len(rows), 4)
            for r in rows:
                self.assertEqual(r["max_tokens"], 200)
                ask, block = r["prompt"].split("```python\n")
                name = block.split(" ", 1)[0]
                self.assertIn(f"rename `{name}` to `{name}_v2`", ask)
                lines = block.split("\n")
                self.assertEqual(lines[0], name + " = {")
                entries = [re.fullmatch(r'    "(\w+)": (\d+),', line) for line in lines[1:17]]
                self.assertTrue(all(entries), block)
                self.assertEqual(len({m.group(1) for m in entries}), 16)  # distinct keys
                self.assertEqual(lines[17:], ["}", "```", ""])
            self.assertEqual(len({r["prompt"] for r in rows}), 4)
        p = bench("-m", STORIES, "--workload", "copy-longer", "--num-prompts", "1")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("--workload must be random, shared-prefix, copy or copy-long", p.stderr)


class Progress(unittest.TestCase):
    # 30 requests arriving at 15/s: a run of about two seconds, offline.
    ARGS = ["-m", STORIES, "-t", "1", "--dataset-name", "random", "--num-prompts", "30", "--request-rate", "15",
            "--random-input-len", "8", "--random-output-len", "4"]

    def test_only_on_a_terminal(self):
        master, slave = pty.openpty()
        proc = subprocess.Popen([BINARY, "bench", *self.ARGS], stdout=slave, stderr=subprocess.DEVNULL)
        os.close(slave)
        out = b""
        deadline = time.time() + 120
        while time.time() < deadline:
            r, _, _ = select.select([master], [], [], 1)
            if not r:
                if proc.poll() is not None:
                    break
                continue
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            out += data
        proc.wait(timeout=60)
        os.close(master)
        self.assertEqual(proc.returncode, 0)
        self.assertRegex(out.decode(), r"\r\d+/30 requests done")
        self.assertIn("Successful requests:                     30", out.decode())
        piped = bench(*self.ARGS)
        self.assertEqual(piped.returncode, 0, piped.stderr)
        self.assertNotIn("\r", piped.stdout)
        self.assertNotIn("requests done", piped.stdout + piped.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
