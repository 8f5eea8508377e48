"""Issue 20: the PromQL queries of vLLM's example Grafana dashboard
(examples/online_serving/prometheus_grafana/grafana.json in vllm-project/vllm, every
panel's "expr", with $model_name and $__rate_interval as Grafana fills them) resolve
against `pagoda serve --metrics-name-prefix vllm`: every metric name they use is a
series of /metrics, with the model_name label, and the labels they group by exist.
Usage: test_metric_names.py PAGODA DATA_DIR
"""
import os
import re
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from clitest import Launched, parse_series  # noqa: E402

BINARY, DATA = sys.argv[1], sys.argv[2]
MODEL = os.path.join(DATA, "stories260K.gguf")
NAME = "my-model"

# The dashboard's queries, one per panel target, as written there.
GRAFANA_QUERIES = [
    'histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.95, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.9, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.5, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:e2e_request_latency_seconds_sum{model_name="$model_name"}[$__rate_interval])\n/\nrate(vllm:e2e_request_latency_seconds_count{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:prompt_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:generation_tokens_total{model_name="$model_name"}[$__rate_interval])',
    'histogram_quantile(0.99, sum by(le) (rate(vllm:time_per_output_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.95, sum by(le) (rate(vllm:time_per_output_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.9, sum by(le) (rate(vllm:time_per_output_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.5, sum by(le) (rate(vllm:time_per_output_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:time_per_output_token_seconds_sum{model_name="$model_name"}[$__rate_interval])\n/\nrate(vllm:time_per_output_token_seconds_count{model_name="$model_name"}[$__rate_interval])',
    'vllm:num_requests_running{model_name="$model_name"}',
    'vllm:num_requests_swapped{model_name="$model_name"}',
    'vllm:num_requests_waiting{model_name="$model_name"}',
    'histogram_quantile(0.99, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.95, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.9, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'histogram_quantile(0.5, sum by(le) (rate(vllm:time_to_first_token_seconds_bucket{model_name="$model_name"}[$__rate_interval])))',
    'rate(vllm:time_to_first_token_seconds_sum{model_name="$model_name"}[$__rate_interval])\n/\nrate(vllm:time_to_first_token_seconds_count{model_name="$model_name"}[$__rate_interval])',
    'vllm:gpu_cache_usage_perc{model_name="$model_name"}',
    'vllm:cpu_cache_usage_perc{model_name="$model_name"}',
    'sum by(le) (increase(vllm:request_prompt_tokens_bucket{model_name="$model_name"}[$__rate_interval]))',
    'sum by(le) (increase(vllm:request_generation_tokens_bucket{model_name="$model_name"}[$__rate_interval]))',
    'sum by(finished_reason) (increase(vllm:request_success_total{model_name="$model_name"}[$__rate_interval]))',
    'rate(vllm:request_queue_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_prefill_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_decode_time_seconds_sum{model_name="$model_name"}[$__rate_interval])',
    'rate(vllm:request_max_num_generation_tokens_sum{model_name="$model_name"}[$__rate_interval])',
]
# Also asked for by issue 20 (vLLM's names, not on that dashboard).
OTHER_NAMES = ["vllm:iteration_tokens_total_bucket", "vllm:cache_config_info", "vllm:kv_cache_usage_perc",
               "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
               "vllm:inter_token_latency_seconds_bucket"]


class GrafanaMetricNames(unittest.TestCase):
    def test_dashboard_queries_resolve(self):
        srv = Launched(BINARY, ["serve", MODEL, "--port", "0", "--metrics-name-prefix", "vllm",
                                "--served-model-name", NAME, "--log-stats-interval", "0"])
        try:
            self.assertIsNotNone(srv.port, srv.text())
            # Two requests, so every histogram (inter-token latency too) has samples.
            for _ in range(2):
                r = srv.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0})
                self.assertEqual(r["usage"]["completion_tokens"], 6)
            series = parse_series(srv.get("/metrics"))
        finally:
            srv.stop()
        # Every series carries the served name, none the pagoda prefix; the standard
        # process_* gauges (resident memory, as prometheus_client writes them for vLLM)
        # are the process's, with no prefix and no model.
        for name, samples in series.items():
            if name.startswith("process_"):
                continue
            self.assertTrue(name.startswith("vllm:"), name)
            for labels, _ in samples:
                self.assertEqual(labels.get("model_name"), NAME, name)
        names = set()
        for q in GRAFANA_QUERIES:
            found = re.findall(r"vllm:[a-zA-Z0-9_:]+", q)
            self.assertTrue(found, q)
            names.update(found)
            for group in re.findall(r"sum by\s*\(([a-z_, ]+)\)", q):
                for label in group.replace(" ", "").split(","):
                    for n in found:
                        self.assertTrue(any(label in s for s, _ in series.get(n, [])),
                                        f"{n} has no '{label}' label (query {q!r})")
        self.assertEqual(len(names), 23)  # the dashboard's distinct series names (_bucket/_sum/_count apart)
        for n in sorted(names) + OTHER_NAMES:
            self.assertIn(n, series, f"{n} is not in /metrics")
        # Values that the traffic above fixes: 2 requests of 6 tokens, both cut by length.
        def value(name, **labels):
            vals = [v for ls, v in series[name] if all(ls.get(k) == x for k, x in labels.items())]
            self.assertEqual(len(vals), 1, (name, labels))
            return vals[0]
        self.assertEqual(value("vllm:request_success_total", finished_reason="length"), 2)
        self.assertEqual(value("vllm:request_generation_tokens_sum"), 12)
        self.assertEqual(value("vllm:request_generation_tokens_count"), 2)
        self.assertEqual(value("vllm:request_max_num_generation_tokens_sum"), 12)
        self.assertEqual(value("vllm:generation_tokens_total"), 12)
        self.assertEqual(value("vllm:request_prompt_tokens_sum"), value("vllm:prompt_tokens_total"))
        self.assertEqual(value("vllm:request_queue_time_seconds_count"), 2)
        self.assertEqual(value("vllm:e2e_request_latency_seconds_count"), 2)
        # 5 tokens after the first of each request, one inter-token sample each (one token per step).
        self.assertEqual(value("vllm:time_per_output_token_seconds_count"), 10)
        self.assertEqual(value("vllm:num_requests_swapped"), 0)
        self.assertEqual(value("vllm:cache_config_info", block_size="16", cache_dtype="f16"), 1)

if __name__ == "__main__":
    unittest.main(argv=[sys.argv[0], "-v"])
