"""Issue 20: one parser for every subcommand. Each subcommand names an unknown flag in
its error (exit 2); `pagoda bench`'s llama-bench mode reads its flags through the same
parser, so PAGODA_* environment variables, --name=VALUE and --n_prompt spellings work
there too, with llama-bench's list syntax kept; `pagoda bench`'s serving mode applies
--gpu-memory-utilization (the fraction of RAM for weights + KV cache) as serve does.
Usage: test_one_parser.py PAGODA DATA_DIR
"""
import json
import os
import subprocess
import sys
import unittest

BINARY, DATA = sys.argv[1], sys.argv[2]
STORIES = os.path.join(DATA, "stories260K.gguf")
# No PAGODA_* variable of the caller leaks into these runs.
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("PAGODA_")}

# Every subcommand; the extra arguments it needs to reach its flag check.
SUBCOMMANDS = {
    "bench": ["-m", STORIES], "bench-serving": ["--workload", "random", "-m", STORIES], "run": ["-m", STORIES, "-p", "x"],
    "serve": ["-m", STORIES], "sim": ["-m", STORIES], "size": ["-m", STORIES], "synth": [], "template": [],
    "inspect": ["-m", STORIES], "perplexity": ["-m", STORIES, "-f", "/dev/null"], "router": ["--replica", "http://127.0.0.1:9", "-m", "none"],
}


def pagoda(*args, env=None, timeout=120):
    full_env = dict(CLEAN_ENV, **(env or {}))
    return subprocess.run([BINARY, *args], capture_output=True, text=True, timeout=timeout, env=full_env)


def jsonl(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


class UnknownFlags(unittest.TestCase):
    def test_every_subcommand_names_the_flag(self):
        # The table covers every registered subcommand (`pagoda --help` lists them).
        listed = {line.split()[0] for line in pagoda("--help").stderr.splitlines() if line.startswith("  ")}
        self.assertEqual(listed, set(SUBCOMMANDS))
        for cmd, extra in SUBCOMMANDS.items():
            for flag in ("--no-such-flag", "--no_such_flag=3"):
                with self.subTest(cmd=cmd, flag=flag):
                    p = pagoda(cmd, *extra, flag, "1" if "=" not in flag else "2", timeout=60)
                    self.assertEqual(p.returncode, 2, p.stderr)
                    self.assertIn("unknown flag " + flag.split("=")[0], p.stderr)
                    self.assertEqual(p.stdout, "")


class LlamaBenchThroughTheParser(unittest.TestCase):
    BASE = ["-m", STORIES, "--no-bandwidth", "-o", "jsonl"]

    def records_of(self, p):
        self.assertEqual(p.returncode, 0, p.stderr)
        return [(r["n_prompt"], r["n_gen"], r["n_threads"], len(r["samples_ns"])) for r in jsonl(p.stdout)]

    def test_environment_mapping(self):
        env = {"PAGODA_N_PROMPT": "8,16", "PAGODA_N_GEN": "0", "PAGODA_REPETITIONS": "1", "PAGODA_THREADS": "1"}
        self.assertEqual(self.records_of(pagoda("bench", *self.BASE, env=env)), [(8, 0, 1, 1), (16, 0, 1, 1)])
        # The output format and a switch from the environment too.
        p = pagoda("bench", "-m", STORIES, env=dict(env, PAGODA_OUTPUT="jsonl", PAGODA_NO_BANDWIDTH="1"))
        self.assertEqual(self.records_of(p), [(8, 0, 1, 1), (16, 0, 1, 1)])
        self.assertEqual([r["read_gb_per_s"] for r in jsonl(p.stdout)], [0, 0])
        # A flag on the command line wins over its variable; the others still apply.
        p = pagoda("bench", *self.BASE, "-p", "4", "--n_gen=2", env=env)
        self.assertEqual(self.records_of(p), [(4, 0, 1, 1), (0, 2, 1, 1)])
        # A bad value from the environment names the flag.
        p = pagoda("bench", *self.BASE, env=dict(env, PAGODA_N_PROMPT="x"))
        self.assertEqual(p.returncode, 2)
        self.assertIn("-p: 'x' is not a list of integers", p.stderr)

    def test_llama_bench_lists_keep_their_order(self):
        # Repeated flags and their long, underscore and `=` spellings append in command-line order.
        p = pagoda("bench", *self.BASE, "-p", "4", "--n_prompt", "8", "-n", "0", "--n-gen=2", "-r", "1", "-t", "1")
        self.assertEqual(self.records_of(p), [(4, 0, 1, 1), (8, 0, 1, 1), (0, 2, 1, 1)])
        p = pagoda("bench", STORIES, "--no-bandwidth", "-o", "jsonl", "-p", "4", "-n", "0", "-r", "1", "-t", "1")
        self.assertEqual(self.records_of(p), [(4, 0, 1, 1)])  # the model as a positional argument
        self.assertEqual(jsonl(p.stdout)[0]["model_filename"], STORIES)
        # A positional model replaces PAGODA_MODEL (a flag given wins over its variable).
        p = pagoda("bench", STORIES, "--no-bandwidth", "-o", "jsonl", "-p", "4", "-n", "0", "-r", "1", "-t", "1",
                   env={"PAGODA_MODEL": "/nonexistent/model.gguf"})
        self.assertEqual([r["model_filename"] for r in jsonl(p.stdout)], [STORIES], p.stderr)


class BenchServing(unittest.TestCase):
    WORK = ["--workload", "random", "--input-len", "4", "--output-len", "2", "-t", "1", "--json", "-m", STORIES]

    def run_json(self, *args, env=None):
        p = pagoda("bench", *self.WORK, *args, env=env)
        self.assertEqual(p.returncode, 0, p.stderr)
        return json.loads(p.stdout)

    def test_environment_mapping(self):
        j = self.run_json(env={"PAGODA_NUM_PROMPTS": "3"})
        self.assertEqual((j["num_prompts"], j["completed"]), (3, 3))
        self.assertEqual(self.run_json("--num-prompts", "2", env={"PAGODA_NUM_PROMPTS": "3"})["completed"], 2)
        # The workload selector itself from the environment picks the serving mode.
        p = pagoda("bench", *self.WORK[2:], env={"PAGODA_WORKLOAD": "random", "PAGODA_NUM_PROMPTS": "2"})
        self.assertEqual(p.returncode, 0, p.stderr)
        j = json.loads(p.stdout)
        self.assertEqual((j["workload"], j["completed"]), ("random", 2))

    def test_gpu_memory_utilization_sizes_the_kv_pool(self):
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        weights = os.path.getsize(STORIES)
        default = self.run_json("--num-prompts", "1")
        pools = []
        for f in (0.001, 0.002):
            j = self.run_json("--num-prompts", "1", "--gpu-memory-utilization", str(f))
            budget = int(f * ram) - weights
            per_block = j["kv_cache_bytes"] / j["kv_cache_blocks"]
            self.assertEqual(per_block, default["kv_cache_bytes"] / default["kv_cache_blocks"])
            # The pool is the budget F x RAM - weights in whole blocks.
            self.assertLessEqual(j["kv_cache_bytes"], budget)
            self.assertGreater(j["kv_cache_bytes"], budget - per_block)
            pools.append(j["kv_cache_blocks"])
        self.assertGreater(pools[1], pools[0])
        self.assertNotEqual(pools[0], default["kv_cache_blocks"])
        # An explicit pool size wins over the fraction, as in serve.
        j = self.run_json("--num-prompts", "1", "--gpu-memory-utilization", "0.002", "--num-kv-blocks", "64")
        self.assertEqual(j["kv_cache_blocks"], 64)
        p = pagoda("bench", *self.WORK, "--gpu-memory-utilization", "1.5")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--gpu-memory-utilization must be in (0, 1]", p.stderr)
        # The single-stream (llama-bench) mode has one sequence's pool: the flag is refused, by name.
        p = pagoda("bench", "-m", STORIES, "--gpu-memory-utilization", "0.5")
        self.assertEqual(p.returncode, 2)
        self.assertIn("--gpu-memory-utilization sizes the KV pool of a serving run", p.stderr)


if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
