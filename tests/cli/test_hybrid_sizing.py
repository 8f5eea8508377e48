#!/usr/bin/env python3
"""Issue 38 (sizing): `pagoda size`, `pagoda sim` and `pagoda inspect` count a hybrid
model's recurrent state per sequence plus the K/V per token of its attention layers
only, with the engine's pool arithmetic, and agree with each other and with the
numbers computed here from the model's shape alone.

The models are the synth presets lfm2-350m and qwen3.5-0.8b written with
`pagoda synth --metadata-only` (their real metadata, no weights: sizing reads none).
`pagoda sim` runs the real scheduler and KvManager on the pool: the fixed
--kv-cache-memory must hold exactly the predicted number of full-context sequences
at once (the engine itself on the tiny presets: tests/engine_capacity).

  test_hybrid_sizing.py PAGODA_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile

BUDGET = 64 << 20   # --kv-cache-memory
CONTEXT = 1024      # tokens per sequence
BLOCK = 16          # tokens per block (the default)
WATERMARK = 0.01    # the default
F16 = 2
F32 = 4

# The presets' shapes, as src/gguf/synth.cc writes them (LFM2-350M's and Qwen3.5-0.8B's configs).
PRESETS = {
    "lfm2-350m": dict(layers=16, attn_layers=[2, 5, 8, 10, 12, 14], embd=1024, kv_heads=8, head_dim=64,
                      state_rows_per_layer=3 - 1, state_row_floats=1024),  # l_cache 3: 2 rows of n_embd
    # Gated DeltaNet: conv kernel 4 over q|k|v (2 x 16 k heads + 16 v heads, rows of S = 128)
    # + 16 v heads' S x S state; gated attention every 4th layer, 2 KV heads of 256.
    "qwen3.5-0.8b": dict(layers=24, attn_layers=[3, 7, 11, 15, 19, 23], embd=1024, kv_heads=2, head_dim=256,
                         state_rows_per_layer=(4 - 1) * (2 * 16 + 16) + 16 * 128, state_row_floats=128),
}


def expected(p):
    """The pool a BUDGET holds, from the shape alone (kv/sizing.h's layout written out)."""
    attn = len(p["attn_layers"])
    rec = p["layers"] - attn
    kv_row = p["kv_heads"] * p["head_dim"] * F16                 # one token's K (or V) in one layer
    e = {"attn": attn, "rec": rec}
    e["kv_per_token"] = attn * 2 * kv_row
    e["state_rows"] = rec * p["state_rows_per_layer"]
    row_bytes = p["state_row_floats"] * F32
    e["state_bytes"] = e["state_rows"] * row_bytes
    # A block: `attn` layer slots (one group: no window) x BLOCK tokens x K, V. The state's
    # rows go chunk by chunk (a chunk: one slot's K or V, BLOCK rows), never across one.
    e["block_bytes"] = attn * BLOCK * 2 * kv_row
    rows_per_block = (BLOCK * kv_row // row_bytes) * 2 * attn
    e["state_blocks"] = -(-e["state_rows"] // rows_per_block)
    e["num_blocks"] = BUDGET // e["block_bytes"]
    usable = e["num_blocks"] - 1 - int(WATERMARK * (e["num_blocks"] - 1) + 1e-9)
    e["blocks_per_seq"] = -(-CONTEXT // BLOCK) + e["state_blocks"]
    e["max_seqs"] = usable // e["blocks_per_seq"]
    # One sequence alone: the longest L with ceil(L / BLOCK) + state blocks <= blocks - 1.
    e["max_tokens"] = (e["num_blocks"] - 1 - e["state_blocks"]) * BLOCK
    return e


def run_json(binary, *args):
    r = subprocess.run([binary, *args], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"{args}: rc {r.returncode}\n{r.stderr}"
    return json.loads(r.stdout)


def check(binary, tmp, name, p):
    path = os.path.join(tmp, name + ".gguf")
    r = subprocess.run([binary, "synth", "--preset", name, "--metadata-only", "-o", path], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    e = expected(p)
    print(f"{name}: expected {e}")
    common = ["--kv-cache-memory", str(BUDGET), "--kv-dtype", "f16", "--weights-dtype", "q8_0"]

    size = run_json(binary, "size", "-m", path, *common, "--context", str(CONTEXT), "--json")
    assert size["recurrent_layers"] == e["rec"], size["recurrent_layers"]
    assert size["kv_bytes_per_token"] == e["kv_per_token"], size["kv_bytes_per_token"]
    assert size["state_bytes_per_sequence"] == e["state_bytes"], size["state_bytes_per_sequence"]
    assert size["state_blocks_per_sequence"] == e["state_blocks"], size["state_blocks_per_sequence"]
    assert size["kv_bytes_per_block"] == e["block_bytes"], size["kv_bytes_per_block"]
    assert size["kv_bytes_per_request"] == CONTEXT * e["kv_per_token"] + e["state_bytes"]
    pool = size["pool"]
    assert pool["num_blocks"] == e["num_blocks"], pool
    assert pool["blocks_per_request"] == e["blocks_per_seq"], pool
    assert pool["max_concurrency"] == e["max_seqs"], pool
    assert pool["max_tokens"] == e["max_tokens"], pool

    # Sizing alone (no budget): the same per-token and per-sequence figures.
    alone = run_json(binary, "size", "-m", path, "--kv-dtype", "f16", "--context", str(CONTEXT), "--json")
    for k in ("kv_bytes_per_token", "state_bytes_per_sequence", "state_blocks_per_sequence", "kv_bytes_per_request"):
        assert alone[k] == size[k], (k, alone[k], size[k])

    ins = run_json(binary, "inspect", path, "--kv-cache-memory", str(BUDGET), "--context", str(CONTEXT), "--json")
    assert ins["kv_bytes_per_token"]["f16"] == e["kv_per_token"], ins["kv_bytes_per_token"]
    st = ins["recurrent_state"]
    assert st["layers"] == e["rec"] and st["attention_layers"] == e["attn"], st
    assert st["bytes_per_sequence"] == e["state_bytes"], st
    kp = ins["kv_pool"]
    assert kp["block_bytes"] == e["block_bytes"] and kp["num_blocks"] == e["num_blocks"], kp
    assert kp["state_blocks_per_sequence"] == e["state_blocks"], kp
    assert kp["blocks_per_sequence"] == e["blocks_per_seq"], kp
    assert kp["max_sequences"] == e["max_seqs"], kp
    assert kp["max_tokens"] == e["max_tokens"], kp

    # The allocator: the real scheduler and KvManager on that pool, given 3 more
    # full-context requests than predicted (prompt CONTEXT - 2 and 2 outputs: the
    # prompt already takes every block a CONTEXT-token sequence does), all at t = 0.
    n = e["max_seqs"] + 3
    sim = run_json(binary, "sim", "-m", path, *common, "--num-prompts", str(n), "--input-len", str(CONTEXT - 2),
                   "--output-len", "2", "--json")
    assert sim["num_kv_blocks"] == e["num_blocks"], sim
    assert sim["peak_running"] == e["max_seqs"], sim
    assert sim["completed"] == n and sim["num_preemptions"] == 0, sim
    text = subprocess.run([binary, "sim", "-m", path, *common, "--num-prompts", "1", "--input-len", "8",
                           "--output-len", "1"], capture_output=True, text=True, timeout=240).stdout
    want = f"recurrent state {e['state_bytes']} B per sequence in {e['state_blocks']} KV blocks"
    assert want in text, text
    print(f"{name}: size, inspect and sim agree: {e['state_bytes']} B of state in {e['state_blocks']} blocks + "
          f"{e['kv_per_token']} B/token; {BUDGET} B hold {e['max_seqs']} sequences of {CONTEXT} tokens")


# The published Hugging Face configs of the two models (tests/cli/data/<name>/config.json).
HF_DIRS = {"lfm2-350m": "LFM2-350M", "qwen3.5-0.8b": "Qwen3.5-0.8B"}


def check_sources(binary, tmp, name, p):
    """The preset (data/models.json), the Hugging Face config and the GGUF give the same
    state, K/V per token and pool: `size --json`, `sim --json` and `inspect --json` agree
    number for number."""
    e = expected(p)
    gguf = os.path.join(tmp, name + ".gguf")  # written by check()
    hf = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", HF_DIRS[name])
    common = ["--kv-cache-memory", str(BUDGET), "--kv-dtype", "f16", "--weights-dtype", "q8_0"]
    keys = ("recurrent_layers", "kv_bytes_per_token", "state_bytes_per_sequence", "state_blocks_per_sequence",
            "kv_bytes_per_block", "kv_bytes_per_request")
    seen = {}
    for spec in (name, hf, gguf):
        size = run_json(binary, "size", "-m", spec, *common, "--context", str(CONTEXT), "--json")
        got = {k: size[k] for k in keys}
        got.update({k: size["pool"][k] for k in ("num_blocks", "blocks_per_request", "max_concurrency", "max_tokens")})
        assert got["state_bytes_per_sequence"] == e["state_bytes"], (spec, got)
        assert got["kv_bytes_per_token"] == e["kv_per_token"], (spec, got)
        assert got["max_concurrency"] == e["max_seqs"], (spec, got)
        n = e["max_seqs"] + 3
        sim = run_json(binary, "sim", "-m", spec, *common, "--num-prompts", str(n), "--input-len", str(CONTEXT - 2),
                       "--output-len", "2", "--json")
        got.update({k: sim[k] for k in ("num_kv_blocks", "peak_running", "completed", "num_preemptions")})
        ins = run_json(binary, "inspect", spec, "--kv-cache-memory", str(BUDGET), "--context", str(CONTEXT), "--json")
        got["inspect_kv_f16"] = ins["kv_bytes_per_token"]["f16"]
        got["inspect_state"] = ins["recurrent_state"]
        got["inspect_pool"] = ins["kv_pool"]
        assert ins["recurrent_state"]["bytes_per_sequence"] == e["state_bytes"], (spec, ins)
        assert got["peak_running"] == e["max_seqs"], (spec, got)
        seen[spec] = got
    first = seen[name]
    for spec, got in seen.items():
        assert got == first, f"{name}: {spec} gives {got}, the preset {first}"
    print(f"{name}: preset, HF config and GGUF agree: {first}")


def check_tp(binary, name, p):
    """--tp: each rank keeps its share of the state, as vLLM splits it (lfm2: the conv
    channels / tp; qwen35: the k and v heads / tp), and a tp that does not divide them is refused."""
    e = expected(p)
    for tp in (2, 4, 8, 16):
        size = run_json(binary, "size", "-m", name, "--kv-dtype", "f16", "--context", str(CONTEXT), "--tp", str(tp),
                        "--json")
        # Every term of both formulas scales with the split channels / heads: exactly 1/tp of the state.
        assert size["state_bytes_per_sequence"] == e["state_bytes"] // tp, (tp, size)
        assert e["state_bytes"] % tp == 0
        plan = run_json(binary, "size", "-m", name, "--kv-dtype", "f16", "--context", str(CONTEXT), "--tp", str(tp),
                        "--kv-cache-memory", str(BUDGET), "--json")
        assert plan["state_bytes_per_sequence"] == e["state_bytes"] // tp, (tp, plan)
    bad = {"lfm2-350m": 3, "qwen3.5-0.8b": 32}[name]  # 1024 channels / 3; 16 k heads / 32
    r = subprocess.run([binary, "size", "-m", name, "--kv-dtype", "f16", "--tp", str(bad)], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode != 0 and "do not split across tp %d ranks" % bad in r.stderr, r.stderr
    print(f"{name}: --tp 2..16 keep 1/tp of the state per rank; --tp {bad} is refused: {r.stderr.strip()}")


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        for name, p in PRESETS.items():
            check(binary, tmp, name, p)
            check_sources(binary, tmp, name, p)
            check_tp(binary, name, p)
    print("ok")


if __name__ == "__main__":
    main()
