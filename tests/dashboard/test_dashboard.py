"""The live KV cache dashboard (issue 20) in headless Chromium.

usage: test_dashboard.py PAGODA_BINARY MODEL.gguf

One `pagoda serve --api-key` with a small KV pool; the page is opened as a
browser would (/dashboard?key=...&hz=10) and its state read through
window.pagodaDashboard and the DOM:
  - the grid has one cell per usable block, == pagoda:kv_cache_blocks_total;
  - a running request appears in the table (by its response id) and leaves when done;
  - after K requests sharing a 3-block prefix, the tree shows those 3 blocks,
    chained, each with K - 1 hits, and hovering one shows its text;
  - /dashboard/events (and the page) refuse a missing or wrong key.
Needs chromium, chromedriver and selenium: skipped (exit 77) when missing, a
failure when CI=true.
"""
import json
import os
import shutil
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "server"))
from serverutil import OneServerPerClass  # noqa: E402

BINARY = MODEL = None
KEY = "dash-test-key"
NUM_BLOCKS = 300  # --num-kv-blocks: 299 usable


def missing_browser():
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "python selenium is not installed"
    for exe in ("chromium", "chromedriver"):
        if not shutil.which(exe):
            return exe + " is not installed"
    return None


def new_driver():
    """A headless Chromium whose profile and temporary files (the
    org.chromium.Chromium.* singleton directories it otherwise leaves in /tmp)
    live in one directory that quit_driver removes."""
    from selenium import webdriver
    tmp = tempfile.mkdtemp(prefix="pagoda-chromium-")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium")
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1100",
              "--user-data-dir=" + os.path.join(tmp, "profile")):
        opts.add_argument(a)
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"), env=dict(os.environ, TMPDIR=tmp))
    try:
        driver = webdriver.Chrome(options=opts, service=service)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    driver.pagoda_tmp = tmp
    return driver


def quit_driver(driver):
    try:
        driver.quit()
    finally:
        shutil.rmtree(driver.pagoda_tmp, ignore_errors=True)


def get(url, key=KEY, timeout=30):
    """(status, body bytes) of a GET; HTTP errors are returned, not raised."""
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + key} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def post(url, body, timeout=300, key=KEY):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers=dict({"Content-Type": "application/json"},
                                              **({"Authorization": "Bearer " + key} if key else {})))
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_for(fn, timeout=30, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = fn()
        if v:
            return v
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


class Dashboard(OneServerPerClass, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.SERVER = (BINARY, MODEL, ["--api-key", KEY, "--num-kv-blocks", str(NUM_BLOCKS), "-t", "2"])
        super().setUpClass()
        cls.driver = new_driver()
        cls.driver.get(cls.srv.url + "/dashboard?key=" + KEY + "&hz=10")
        wait_for(lambda: cls.js("return window.pagodaDashboard.updates") > 0, what="the first snapshot event")

    @classmethod
    def tearDownClass(cls):
        quit_driver(cls.driver)
        super().tearDownClass()

    @classmethod
    def js(cls, script, *args):
        return cls.driver.execute_script(script, *args)

    def blocks_total(self):
        for line in get(self.srv.url + "/metrics")[1].decode().splitlines():
            if line.startswith("pagoda:kv_cache_blocks_total"):
                return int(float(line.split()[-1]))
        self.fail("no pagoda:kv_cache_blocks_total in /metrics")

    def test_grid_has_one_cell_per_block(self):
        total = self.blocks_total()
        self.assertEqual(total, NUM_BLOCKS - 1)
        self.assertEqual(self.js("return window.pagodaDashboard.numCells"), total)
        self.assertEqual(self.js("return document.getElementById('grid').dataset.cells"), str(total))

    def test_running_request_appears_and_leaves(self):
        # A streamed completion long enough to be seen at 10 Hz; its first chunk
        # names the response id the table shows.
        body = {"prompt": "Once upon a time", "max_tokens": 160, "ignore_eos": True, "stream": True}
        req = urllib.request.Request(self.srv.url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
        first = threading.Event()
        done = threading.Event()
        rid = {}

        def client():
            with urllib.request.urlopen(req, timeout=300) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data: {") and not rid:
                        rid["id"] = json.loads(line[6:])["id"]
                        first.set()
            done.set()

        t = threading.Thread(target=client, daemon=True)
        t.start()
        self.assertTrue(first.wait(120))
        row = "#requests tr[data-tag='%s']" % rid["id"]
        # Seen while it streams (the DOM row and the state the page parsed).
        seen = wait_for(lambda: self.js("const r = document.querySelector(arguments[0]);"
                                        "return r && r.dataset.state === 'running' ? r.cells[8].textContent : null", row),
                        timeout=60, what="the running request's row")
        self.assertRegex(seen, r"^\[\d+( \d+)*")  # its block table
        # Issue 36: why its prefix hit ended (a 5-token prompt: no full block could hit).
        self.assertEqual(self.js("return document.querySelector(arguments[0]).cells[9].textContent", row), "none")
        req_state = self.js("return window.pagodaDashboard.requests.find(r => r.tag === arguments[0]) || null",
                            rid["id"])
        if req_state is not None:  # else it finished in between
            self.assertEqual(req_state["state"], "running")
            self.assertEqual(req_state["why"], "")
            self.assertGreaterEqual(len(req_state["tables"][0]), 1)
        # Its blocks are coloured as its own in the grid.
        # (One script: the state is replaced by every event.)
        got = self.js("const s = window.pagodaDashboard, r = s.requests.find(r => r.tag === arguments[0]);"
                      "return r ? [r.colour, r.tables[0].filter(b => b > 0).map(b => s.cells[b - 1])] : null",
                      rid["id"])
        if got is not None:  # else it finished in between
            colour, cells = got
            self.assertTrue(cells and all(c in (colour, 4) for c in cells), (cells, colour))
        self.assertTrue(done.wait(300))
        wait_for(lambda: self.js("return document.querySelector(arguments[0]) === null", row), timeout=30,
                 what="the finished request to leave the table")
        self.assertIsNone(self.js("return window.pagodaDashboard.requests.find(r => r.tag === arguments[0]) || null",
                                  rid["id"]))

    def test_shared_prefix_tree_shows_hits(self):
        from selenium.webdriver.common.actions.action_builder import ActionBuilder
        bs = 16
        prefix = [3000 + 7 * i for i in range(3 * bs)]  # 3 full blocks no other test uses
        k = 4
        for i in range(k):
            post(self.srv.url + "/v1/completions", {"prompt": prefix + [500 + i, 600 + i, 700 + i], "max_tokens": 1})
        # The first request computed and committed the 3 blocks; the k - 1 others hit all of them.
        def shared_nodes():
            nodes = self.js("return window.pagodaDashboard.prefixNodes.map(n => [n.block, n.parent, n.hits, n.depth])")
            ours = [n for n in nodes if n[2] == k - 1]
            return ours if len(ours) == 3 else None
        ours = wait_for(shared_nodes, what="3 prefix nodes with %d hits" % (k - 1))
        ours.sort(key=lambda n: n[3])
        self.assertEqual([n[3] for n in ours], [0, 1, 2])
        self.assertEqual(ours[0][1], -1)
        self.assertEqual(ours[1][1], ours[0][0])
        self.assertEqual(ours[2][1], ours[1][0])
        # The blocks hold the prefix, in order (the hover endpoint).
        for j, n in enumerate(ours):
            st, body = get(self.srv.url + "/dashboard/block?id=%d" % n[0])
            self.assertEqual(st, 200)
            self.assertEqual(json.loads(body)["tokens"], prefix[j * bs:(j + 1) * bs])
        # Drawn: one circle per node, with its hit count; hovering shows the text.
        # (Read in one script each: the SVG is redrawn whenever the tree changes.)
        sel = "#tree circle[data-block='%d']" % ours[0][0]
        self.assertEqual(self.js("return document.querySelector(arguments[0]).dataset.hits", sel), str(k - 1))
        text = json.loads(get(self.srv.url + "/dashboard/block?id=%d" % ours[0][0])[1])["text"]

        def hovered():
            # The circle's centre in viewport pixels, then a real mouse move there.
            x, y = self.js("const r = document.querySelector(arguments[0]).getBoundingClientRect();"
                           "return [Math.round(r.x + r.width / 2), Math.round(r.y + r.height / 2)]", sel)
            a = ActionBuilder(self.driver)
            a.pointer_action.move_to_location(x, y)
            a.perform()
            t = self.js("return document.getElementById('tip').textContent")
            return t if json.dumps(text) in t else None
        tip = wait_for(hovered, what="the hover text")
        self.assertIn("block %d · %d hits" % (ours[0][0], k - 1), tip)

    def test_api_key_enforced(self):
        url = self.srv.url
        self.assertEqual(get(url + "/dashboard/events", key=None)[0], 401)
        self.assertEqual(get(url + "/dashboard/events?key=wrong", key=None)[0], 401)
        self.assertEqual(get(url + "/dashboard", key=None)[0], 401)
        self.assertEqual(get(url + "/dashboard/snapshot", key="wrong")[0], 401)
        self.assertEqual(get(url + "/dashboard/block?id=1", key=None)[0], 401)
        # The query key works on dashboard routes only.
        self.assertEqual(get(url + "/metrics?key=" + KEY, key=None)[0], 401)
        self.assertEqual(get(url + "/dashboard/events?hz=11", key=KEY)[0], 400)
        # With the key (query or header): an event stream whose first event is a snapshot.
        for u, k in ((url + "/dashboard/events?hz=10&key=" + KEY, None), (url + "/dashboard/events", KEY)):
            req = urllib.request.Request(u, headers={"Authorization": "Bearer " + k} if k else {})
            with urllib.request.urlopen(req, timeout=30) as r:
                self.assertEqual(r.status, 200)
                self.assertTrue(r.headers["Content-Type"].startswith("text/event-stream"))
                self.assertEqual(r.readline().decode().strip(), "event: snapshot")
                data = r.readline().decode()
                self.assertTrue(data.startswith("data: {"))
                self.assertEqual(json.loads(data[6:])["num_blocks"], NUM_BLOCKS)


class HundredThousandBlocks(OneServerPerClass, unittest.TestCase):
    """The page at 100k blocks (stories260K, block size 1: 64 MB of KV): one
    cell per block, and an event decodes and redraws in well under its period."""

    @classmethod
    def setUpClass(cls):
        stories = os.path.join(HERE, "..", "data", "stories260K.gguf")
        cls.SERVER = (BINARY, stories, ["--block-size", "1", "--num-kv-blocks", "100001", "-t", "1"])
        super().setUpClass()
        cls.driver = new_driver()

    @classmethod
    def tearDownClass(cls):
        quit_driver(cls.driver)
        super().tearDownClass()

    def test_grid_and_update_time(self):
        for i in range(4):  # 4 x ~300 used-then-cached blocks, with hits on the shared 200
            post(self.srv.url + "/v1/completions", {"prompt": list(range(10, 210)) + [300 + i] * 100, "max_tokens": 8},
                 key=None)
        self.driver.get(self.srv.url + "/dashboard?hz=4")
        js = self.driver.execute_script
        wait_for(lambda: js("return window.pagodaDashboard.updates") >= 3, what="3 snapshot events")
        self.assertEqual(js("return window.pagodaDashboard.numCells"), 100000)
        # The tree is capped at the 256 most hit blocks (hits only grow towards the
        # root, so they are ancestor-closed): first the shared 200-block chain,
        # 3 hits each, then the first request's own tail.
        nodes = js("return window.pagodaDashboard.prefixNodes.map(n => [n.depth, n.hits])")
        self.assertEqual(len(nodes), 256)
        self.assertEqual(sorted(d for d, h in nodes if h == 3), list(range(200)))
        ms = js("return window.pagodaDashboard.lastUpdateMs")
        print("100k blocks: one event decoded and drawn in %.1f ms" % ms, file=sys.stderr)
        self.assertLess(ms, 1000)
        st, body = get(self.srv.url + "/dashboard/snapshot", key=None)
        self.assertEqual(st, 200)
        print("100k blocks: snapshot JSON %d bytes" % len(body), file=sys.stderr)
        self.assertLess(len(body), 400000)


class Reports(unittest.TestCase):
    """`pagoda sim --report` and `pagoda bench --report`: one self-contained HTML
    file whose embedded series the page draws (5 charts) with the summary."""

    def check_report(self, path, title_part, summary_key):
        with open(path, encoding="utf-8") as f:
            html = f.read()
        self.assertNotIn("/*@", html)          # every placeholder filled
        self.assertNotIn("src=", html)         # nothing loaded from elsewhere
        driver = new_driver()
        try:
            driver.get("file://" + os.path.abspath(path))
            rep = wait_for(lambda: driver.execute_script("return window.pagodaReport || null"), what="the report")
            self.assertIn(title_part, rep["title"])
            self.assertIn(summary_key, rep["summary"])
            self.assertEqual(driver.execute_script("return document.querySelectorAll('canvas.chart').length"), 5)
            return rep
        finally:
            quit_driver(driver)

    def test_sim_report(self):
        import subprocess
        import tempfile
        stories = os.path.join(HERE, "..", "data", "stories260K.gguf")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "sim.html")
            subprocess.run([BINARY, "sim", "--model", stories, "--workload", "shared-prefix", "--num-prompts", "60",
                            "--input-len", "200", "--output-len", "50", "--num-kv-blocks", "60", "--report", out],
                           check=True, stdout=subprocess.DEVNULL)
            rep = self.check_report(out, "sim stories260K", "num_preemptions")
            series = rep["series"]
            # One point per simulated step; the counters of the last are the run's.
            self.assertEqual(len(series), rep["summary"]["num_steps"])
            self.assertEqual(series[-1][8], rep["summary"]["num_preemptions"])
            self.assertEqual(series[-1][9], rep["summary"]["total_output_tokens"])

    def test_bench_report(self):
        import subprocess
        import tempfile
        stories = os.path.join(HERE, "..", "data", "stories260K.gguf")
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "bench.html")
            subprocess.run([BINARY, "bench", "-m", stories, "--workload", "shared-prefix", "--num-groups", "2",
                            "--prompts-per-group", "4", "--prefix-len", "64", "--suffix-len", "16", "--output-len",
                            "64", "--report", out, "--json"], check=True, stdout=subprocess.DEVNULL)
            rep = self.check_report(out, "bench shared-prefix", "completed")
            last = rep["series"][-1]
            self.assertEqual(last[9], 8 * 64)  # generation tokens of the whole run
            self.assertEqual(last[4] + last[5], 0)  # nothing left running or waiting


if __name__ == "__main__":
    BINARY, MODEL = sys.argv[1], sys.argv[2]
    why = missing_browser()
    if why:
        if os.environ.get("CI") == "true":
            print("FAIL: " + why + " (CI=true: the dashboard test must run)")
            sys.exit(1)
        print("SKIP: " + why)
        sys.exit(77)
    unittest.main(argv=sys.argv[:1], verbosity=2)
