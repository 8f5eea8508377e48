#!/usr/bin/env python3
"""Checks the dependency arrows of docs/architecture.md on #include lines.

A module may include only its own headers and those of the modules it points to
(transitively). kv/ includes base/ only. cli/ drives everything through engine/,
server/, sim/ and loadgen/: it may not include kv/, sched/, runtime/, model/, kernels/
or plan/ headers. loadgen/ sees the engine through engine/engine.h and
engine/driver.h (the one loop around Engine::step) only. Exit 1 with
every violation listed.

  check_layering.py SRC_DIR      check a source tree
  check_layering.py --self-test  check the checker on temporary trees
"""
import os, re, shutil, subprocess, sys, tempfile

ALLOWED = {
    "base": set(),
    "gguf": {"base"},
    "tok": {"gguf", "base"},
    "grammar": {"tok", "gguf", "base"},
    "kv": {"base"},
    # KV events (issue 37): msgpack encoding and the ZeroMQ publisher thread.
    "kv_events": {"base"},
    "kernels": {"base"},
    "model": {"gguf", "kernels", "base"},
    "plan": {"sched", "kv", "kernels", "base"},
    "runtime": {"plan", "model", "kernels", "kv", "sched", "gguf", "base"},
    "sample": {"base"},
    "sched": {"kv", "base"},
    "tier": {"base"},
    "engine": {"sched", "kv", "runtime", "sample", "grammar", "tok", "plan", "model", "kernels", "gguf", "tier",
               "kv_events", "base"},
    "sim": {"sched", "kv", "gguf", "base"},
    # The HTTP layer (server, worker pool) and the engine-free request parsing
    # below both server/ and router/ (issue 34).
    "http": {"base"},
    "openai": {"sample", "grammar", "tok", "gguf", "base"},
    "server": {"engine", "http", "openai", "grammar", "tok", "base"},
    # The replica router: never the engine or server/ (it links no engine).
    "router": {"http", "openai", "tok", "gguf", "base"},
    # The load generator (issue 34): the engine through its public API (engine/engine.h
    # and engine/driver.h only, below), the tokenizer for the workloads' prompts.
    "loadgen": {"engine", "tok", "base"},
    # The top: one generation path (engine/), the HTTP server, the simulator, the load
    # generator, and the plain data layers it parses flags and files with.
    "cli": {"engine", "server", "sim", "router", "loadgen", "grammar", "tok", "sample", "gguf", "base"},
}
# plan may include only sched/step_plan.h from sched (DESIGN.md); loadgen only the
# engine's public headers from engine: the API and the driver loop built on it.
ONLY_HEADERS = {("plan", "sched"): {"sched/step_plan.h"},
                ("loadgen", "engine"): {"engine/engine.h", "engine/driver.h"}}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')


def check(root):
    bad = []
    for mod in sorted(os.listdir(root)):
        mdir = os.path.join(root, mod)
        if not os.path.isdir(mdir):
            continue
        allowed = ALLOWED.get(mod, set())
        for dirpath, _, files in os.walk(mdir):
            for f in sorted(files):
                if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                    continue
                path = os.path.join(dirpath, f)
                for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(1)
                    if target == mod or target not in ALLOWED:
                        continue
                    if target not in allowed:
                        bad.append(f"{path}:{n}: {mod}/ may not include {target}/ ({line.strip()})")
                    elif (mod, target) in ONLY_HEADERS and f"{target}/{m.group(2)}" not in ONLY_HEADERS[(mod, target)]:
                        bad.append(f"{path}:{n}: {mod}/ may include only {ONLY_HEADERS[(mod, target)]} from {target}/")
    return bad


def self_test():
    """The checker passes a clean tree and fails each forbidden cli/ include."""
    failures = []
    made = []

    def tree(files):
        d = tempfile.mkdtemp(prefix="layering_")
        made.append(d)
        for rel, text in files.items():
            os.makedirs(os.path.join(d, os.path.dirname(rel)), exist_ok=True)
            with open(os.path.join(d, rel), "w") as f:
                f.write(text)
        return d

    clean = {
        "cli/cmd_run.cc": '#include "cli/command.h"\n#include "engine/engine.h"\n#include "sim/planner.h"\n'
                          '#include "server/server.h"\n#include "tok/tokenizer.h"\n#include "base/log.h"\n',
        "engine/engine.cc": '#include "runtime/model_runner.h"\n#include "kv/sizing.h"\n',
        "plan/batch.h": '#include "sched/step_plan.h"\n',
        "loadgen/driver.h": '#include "engine/engine.h"\n#include "engine/driver.h"\n#include "tok/tokenizer.h"\n'
                            '#include "base/status.h"\n',
        "cli/cmd_bench.cc": '#include "loadgen/driver.h"\n',
    }
    if check(tree(clean)):
        failures.append(f"clean tree reported {check(tree(clean))}")
    for target in ["kv/sizing.h", "sched/scheduler.h", "runtime/model_runner.h", "model/model.h", "kernels/api.h",
                   "plan/batch.h"]:
        files = dict(clean)
        files["cli/cmd_bench.cc"] = f'#include <vector>\n  #  include "{target}"\n'
        bad = check(tree(files))
        if len(bad) != 1 or "cli/cmd_bench.cc:2" not in bad[0]:
            failures.append(f"cli including {target}: expected one violation, got {bad}")
    files = dict(clean)
    files["kv/block_pool.h"] = '#include "sched/request.h"\n'
    files["plan/batch.cc"] = '#include "sched/scheduler.h"\n'
    if len(check(tree(files))) != 2:
        failures.append(f"kv -> sched and plan -> sched/scheduler.h: expected 2 violations, got {check(tree(files))}")
    # loadgen reaches the engine through engine/engine.h and engine/driver.h only, and
    # nothing below it.
    for target in ["engine/snapshot.h", "engine/kv_tiers.h", "sched/scheduler.h", "kv/kv_manager.h", "runtime/model_runner.h",
                   "server/server.h", "cli/command.h"]:
        files = dict(clean)
        files["loadgen/serving.cc"] = f'#include "loadgen/driver.h"\n#include "{target}"\n'
        bad = check(tree(files))
        if len(bad) != 1 or "loadgen/serving.cc:2" not in bad[0]:
            failures.append(f"loadgen including {target}: expected one violation, got {bad}")
    # The router sits on http/ and openai/ only: neither the engine nor server/ (issue 34).
    files = dict(clean)
    files["router/router.cc"] = '#include "http/http.h"\n#include "openai/text.h"\n#include "engine/engine.h"\n' \
                                '#include "server/server.h"\n'
    if len(check(tree(files))) != 2:
        failures.append(f"router -> engine and router -> server: expected 2 violations, got {check(tree(files))}")
    # The command line itself: exit status 1 on a violation, 0 on a clean tree.
    files = dict(clean)
    files["cli/cmd_run.cc"] += '#include "runtime/model_runner.h"\n'
    for t, want in ((tree(clean), 0), (tree(files), 1)):
        rc = subprocess.run([sys.executable, os.path.abspath(__file__), t], stdout=subprocess.DEVNULL).returncode
        if rc != want:
            failures.append(f"exit status {rc} on {t}, expected {want}")
    for d in made:
        shutil.rmtree(d, ignore_errors=True)
    for f in failures:
        print("self-test:", f)
    print(f"layering self-test: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 2 and sys.argv[1] == "--self-test":
        sys.exit(self_test())
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    bad = check(sys.argv[1])
    for b in bad:
        print(b)
    print(f"layering: {len(bad)} violation(s)")
    sys.exit(1 if bad else 0)
