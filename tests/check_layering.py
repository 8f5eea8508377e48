#!/usr/bin/env python3
"""Checks the dependency arrows of docs/architecture.md on #include lines.

A module may include only its own headers and those of the modules it points to
(transitively). kv/ includes base/ only. Exit 1 with every violation listed.
"""
import os, re, sys

ALLOWED = {
    "base": set(),
    "gguf": {"base"},
    "tok": {"gguf", "base"},
    "grammar": {"tok", "gguf", "base"},
    "kv": {"base"},
    "kernels": {"base"},
    "model": {"gguf", "kernels", "base"},
    "plan": {"sched", "kv", "kernels", "base"},
    "runtime": {"plan", "model", "kernels", "kv", "sched", "gguf", "base"},
    "sample": {"base"},
    "sched": {"kv", "base"},
    "engine": {"sched", "kv", "runtime", "sample", "tok", "plan", "model", "kernels", "gguf", "base"},
    "sim": {"sched", "kv", "gguf", "base"},
    "server": {"engine", "tok", "base"},
    "cli": None,  # top of the graph
}
# plan may include only sched/step_plan.h from sched (DESIGN.md)
ONLY_HEADERS = {("plan", "sched"): {"sched/step_plan.h"}}

inc = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/([^"]+)"')
root = sys.argv[1]
bad = []
for mod in sorted(os.listdir(root)):
    mdir = os.path.join(root, mod)
    if not os.path.isdir(mdir):
        continue
    allowed = ALLOWED.get(mod, set())
    for dirpath, _, files in os.walk(mdir):
        for f in files:
            if not f.endswith((".h", ".cc", ".cu", ".cuh")):
                continue
            path = os.path.join(dirpath, f)
            for n, line in enumerate(open(path, encoding="utf-8", errors="replace"), 1):
                m = inc.match(line)
                if not m:
                    continue
                target = m.group(1)
                if allowed is None or target == mod:
                    continue
                if target not in ALLOWED:
                    continue
                if target not in allowed:
                    bad.append(f"{path}:{n}: {mod}/ may not include {target}/ ({line.strip()})")
                elif (mod, target) in ONLY_HEADERS and f"{target}/{m.group(2)}" not in ONLY_HEADERS[(mod, target)]:
                    bad.append(f"{path}:{n}: {mod}/ may include only {ONLY_HEADERS[(mod, target)]} from {target}/")
for b in bad:
    print(b)
print(f"layering: {len(bad)} violation(s)")
sys.exit(1 if bad else 0)
