"""Takes docs/img/dashboard.png: the dashboard of a `pagoda serve` under a
shared-prefix workload with a KV pool small enough to queue and preempt.

usage: python3 tests/dashboard/screenshot.py build/release/src/cli/pagoda \
           models/SmolLM2-135M-Instruct.Q4_1.gguf docs/img/dashboard.png
(Not a test: run by hand when the page changes.)
"""
import json
import os
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
sys.path.insert(0, HERE)
from serverutil import PagodaServer  # noqa: E402
from test_dashboard import new_driver, wait_for  # noqa: E402

SYSTEMS = [
    "You are a patient tutor. Explain every step of the reasoning in plain words, give a short example, "
    "and end with one question that checks understanding. Keep the tone warm and the sentences short.",
    "You are a travel planner. Suggest a day-by-day plan with one museum, one walk and one local dish per day, "
    "name the neighbourhood of each stop and say how long to spend there.",
    "You are a code reviewer. Point out bugs first, then naming, then style. Quote the line you mean and "
    "propose a concrete fix in one or two sentences.",
]
QUESTIONS = ["Why is the sky blue?", "Plan three days in Lisbon.", "Review: for i in range(len(xs)): print(xs[i])",
             "What is a prime number?", "Plan two days in Kyoto.", "Review: if x == None: return",
             "How do vaccines work?", "Plan a weekend in Vienna.", "Review: except: pass"]


def main():
    binary, model, out = sys.argv[1], sys.argv[2], sys.argv[3]
    extra = ["--num-kv-blocks", "48", "--max-num-seqs", "6", "-t", "2"]
    with PagodaServer(binary, model, extra) as srv:
        stop = threading.Event()

        def client(i):
            n = 0
            while not stop.is_set():
                q = QUESTIONS[(i + 3 * n) % len(QUESTIONS)]
                body = {"messages": [{"role": "system", "content": SYSTEMS[(i + n) % 3]}, {"role": "user", "content": q}],
                        "max_tokens": 90 + 20 * (i % 4), "ignore_eos": True}
                req = urllib.request.Request(srv.url + "/v1/chat/completions", data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
                try:
                    urllib.request.urlopen(req, timeout=600).read()
                except Exception:
                    pass
                n += 1

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(10)]
        for t in threads:
            t.start()
            time.sleep(0.3)
        driver = new_driver()
        try:
            driver.set_window_size(1600, 1180)
            driver.get(srv.url + "/dashboard?hz=4")
            time.sleep(20)  # some history in the charts
            # A moment with requests running and waiting, and prefix hits in the tree.
            wait_for(lambda: driver.execute_script(
                "const s = window.pagodaDashboard.snapshot;"
                "return s && s.num_running >= 4 && s.num_waiting >= 2 && s.prefix.nodes.length >= 6 &&"
                " s.counters.preemptions > 0"), timeout=90,
                what="a busy moment")
            time.sleep(0.3)
            driver.save_screenshot(out)
            print("wrote", out)
        finally:
            stop.set()
            driver.quit()


if __name__ == "__main__":
    main()
