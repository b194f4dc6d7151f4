"""The Prometheus config, alert rules and Grafana dashboards, checked offline: `promtool check
config`, `promtool check rules`, the rules' unit tests (`promtool test rules`), and the
dashboards' structure (Grafana's dashboard model, the DS_PROMETHEUS and model/preset variables,
every panel on that data source with a query). Needs promtool (Debian's `prometheus` package).
"""

import json
import os
import re
import subprocess
import sys
import unittest

sys.path.insert(0, os.getcwd())
from deploy import test_report  # noqa: E402

DEPLOY = os.path.join(os.getcwd(), "deploy")
PROMETHEUS = os.path.join(DEPLOY, "prometheus")
GRAFANA = os.path.join(DEPLOY, "grafana")
DASHBOARDS = ("sluice-memory.json", "sluice-throughput.json")


def promtool(*args):
    out = subprocess.run(["promtool"] + list(args), cwd=PROMETHEUS, capture_output=True,
                         text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


class Promtool(unittest.TestCase):
    def test_check_config(self):
        rc, out = promtool("check", "config", "prometheus.yml")
        self.assertEqual(rc, 0, out)
        self.assertIn("SUCCESS", out)

    def test_check_rules(self):
        rc, out = promtool("check", "rules", "rules.yml")
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"SUCCESS: [1-9]\d* rules found")

    def test_rules_unit_tests(self):
        rc, out = promtool("test", "rules", "rules_test.yml")
        self.assertEqual(rc, 0, out)

    def test_every_alert_has_a_unit_test_that_fires_it(self):
        with open(os.path.join(PROMETHEUS, "rules.yml")) as f:
            alerts = set(re.findall(r"(?m)^\s*- alert: (\w+)", f.read()))
        with open(os.path.join(PROMETHEUS, "rules_test.yml")) as f:
            text = f.read()
        # An alertname followed by a non-empty exp_alerts list.
        fired = set(re.findall(r"alertname: (\w+)\n\s*exp_alerts:\n\s*- exp_labels", text))
        self.assertTrue(alerts)
        self.assertEqual(alerts - fired, set())

    def test_a_broken_rule_is_rejected(self):
        # The checks above can fail: promtool rejects an expression that does not parse.
        bad = os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "bad_rules.yml")
        with open(bad, "w") as f:
            f.write("groups:\n  - name: x\n    rules:\n      - alert: X\n"
                    "        expr: sum by (le (rate(x[5m]))\n")
        rc, out = promtool("check", "rules", bad)
        self.assertNotEqual(rc, 0, out)


class Dashboards(unittest.TestCase):
    def load(self, name):
        with open(os.path.join(GRAFANA, name)) as f:
            return json.load(f)

    def test_dashboard_model(self):
        uids = set()
        for name in DASHBOARDS:
            d = self.load(name)
            self.assertNotIn(d["uid"], uids)
            uids.add(d["uid"])
            self.assertGreaterEqual(d["schemaVersion"], 36, name)
            variables = {v["name"]: v for v in d["templating"]["list"]}
            self.assertEqual(variables["DS_PROMETHEUS"]["type"], "datasource")
            self.assertEqual(variables["DS_PROMETHEUS"]["query"], "prometheus")
            self.assertEqual(variables["model"]["type"], "query")
            self.assertIn("label_values(", variables["model"]["definition"])
            ids = set()
            for p in d["panels"]:
                self.assertNotIn(p["id"], ids, name)
                ids.add(p["id"])
                g = p["gridPos"]
                self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
                if p["type"] == "row":
                    continue
                self.assertEqual(p["datasource"], {"type": "prometheus",
                                                   "uid": "${DS_PROMETHEUS}"}, p["title"])
                self.assertTrue(p["targets"], p["title"])
                self.assertTrue(p.get("description"), p["title"])
                for t in p["targets"]:
                    self.assertTrue(t["expr"].strip(), p["title"])
                    self.assertIn('model=~"$model"', t["expr"], p["title"])
        self.assertIn("preset", {v["name"] for v in self.load(DASHBOARDS[0])["templating"]["list"]})

    def test_rows_cover_the_figures_operators_look_for(self):
        exprs = {name: " ".join(t["expr"] for p in self.load(name)["panels"]
                                for t in p.get("targets", []))
                 for name in DASHBOARDS}
        memory = ["sluice_kv_pages_used", "sluice_kv_pages_free", "sluice_kv_compression_ratio",
                  "sluice_request_kv_fp16_bytes_total", "sluice_kv_fragmentation_ratio",
                  "sluice_kv_pages_reserved", "sluice_kv_reservations_expired_total",
                  "sluice_kv_pool_resident_bytes"]
        throughput = ["sluice_prompt_tokens_total", "sluice_generation_tokens_total",
                      "sluice_requests_total", "sluice_time_to_first_token_seconds_bucket",
                      "sluice_inter_token_latency_seconds_bucket",
                      "sluice_request_queue_seconds_bucket", "sluice_requests_running",
                      "sluice_requests_waiting", "sluice_kv_transfer_bytes_total",
                      "sluice_kv_transfer_failures_total", "sluice_prefix_cache_hit_tokens_total",
                      "sluice_prefix_cache_bytes_not_sent_total",
                      "sluice_prefix_cache_held_entries",
                      "sluice_prefill_step_seconds_bucket", "sluice_prefill_step_seconds_sum"]
        for m in memory:
            self.assertIn(m, exprs["sluice-memory.json"])
        for m in throughput:
            self.assertIn(m, exprs["sluice-throughput.json"])


if __name__ == "__main__":
    test_report.main(__name__, "monitoring_config")
