#!/usr/bin/env python3
"""Runs grammar_walks and validates every generated document with jsonschema.

Each walk must finish (emit end-of-generation), parse as JSON and validate
against its schema. Exit 77 (ctest skip) when the jsonschema module is missing.
"""
import json, subprocess, sys

try:
    import jsonschema
except ImportError:
    print("jsonschema not installed: skipped")
    sys.exit(77)

exe = sys.argv[1]
walks = sys.argv[2] if len(sys.argv) > 2 else "30"
out = subprocess.run([exe, walks], check=True, capture_output=True, text=True).stdout
bad, n, by_schema = [], 0, {}
for line in out.splitlines():
    rec = json.loads(line)
    n += 1
    key = json.dumps(rec["schema"], sort_keys=True)[:60]
    by_schema[key] = by_schema.get(key, 0) + 1
    if not rec["finished"]:
        bad.append(("unfinished", rec["doc"][:200]))
        continue
    try:
        doc = json.loads(rec["doc"])
    except ValueError as e:
        bad.append((f"not JSON: {e}", rec["doc"]))
        continue
    try:
        jsonschema.validate(doc, rec["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    except jsonschema.ValidationError as e:
        bad.append((f"invalid: {e.message}", rec["doc"]))
for why, doc in bad[:20]:
    print(f"FAIL {why}: {doc!r}")
print(f"{n} documents, {len(bad)} failures; per schema: {sorted(by_schema.values())}")
sys.exit(1 if bad or n == 0 else 0)
