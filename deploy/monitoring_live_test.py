"""The dashboards and alert rules against a live cluster: a real sluice cluster (router, prefill
and decode processes started by `sluice up`'s binary) serves a short load of chat requests while
a real Prometheus server scrapes it every second with deploy/prometheus/prometheus.yml (its
targets pointed at the cluster's ports) and evaluates deploy/prometheus/rules.yml. Then every
query of every panel of deploy/grafana, with the dashboard's variables resolved the way Grafana
does, is evaluated through Prometheus' HTTP API: each must parse and return data. Every alert
rule must load, evaluate without error, and stay quiet on the healthy cluster.

Needs SLUICE_MODEL (the GGUF) and the `prometheus` binary (Debian's `prometheus` package).
"""

import concurrent.futures
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.parse
import urllib.request

sys.path.insert(0, os.getcwd())
from deploy import test_report  # noqa: E402
from deploy.test_net import free_port, http, metrics_base  # noqa: E402

MODEL = os.environ.get("SLUICE_MODEL", "")
ROOT = os.getcwd()
PROMETHEUS_DIR = os.path.join(ROOT, "deploy", "prometheus")
GRAFANA_DIR = os.path.join(ROOT, "deploy", "grafana")
DASHBOARDS = ("sluice-memory.json", "sluice-throughput.json")
# About 300 tokens: enough that the prompt's KV fills pages, not only the full-precision window.
LONG_PROMPT = ("Rivers carry water from the mountains to the sea, shaping valleys and feeding "
               "cities along the way. ") * 12 + "Write a long story about one of them."
# Grafana's $__rate_interval for a 1 s scrape interval is 4 s; a little more keeps every panel's
# range query from falling between two slow requests.
RATE_INTERVAL = "10s"


def dashboard_targets():
    """(dashboard, panel title, refId, expr) of every panel query."""
    out = []
    for name in DASHBOARDS:
        with open(os.path.join(GRAFANA_DIR, name)) as f:
            d = json.load(f)
        for p in d["panels"]:
            for t in p.get("targets", []):
                out.append((name, p["title"], t["refId"], t["expr"]))
    return out


def variable_queries():
    """name -> label_values(...) definition of every query variable of the dashboards."""
    out = {}
    for name in DASHBOARDS:
        with open(os.path.join(GRAFANA_DIR, name)) as f:
            for v in json.load(f)["templating"]["list"]:
                if v["type"] == "query":
                    out.setdefault(v["name"], v["definition"])
    return out


def alert_names():
    with open(os.path.join(PROMETHEUS_DIR, "rules.yml")) as f:
        return re.findall(r"(?m)^\s*- alert: (\w+)", f.read())


def adapter_queries():
    """(metric, metricsQuery) of every rule in deploy/k8s/autoscaling/prometheus-adapter.yaml
    (the file's own layout: `as: "NAME"`, then `metricsQuery:` inline or folded with `>-`)."""
    path = os.path.join(ROOT, "deploy", "k8s", "autoscaling", "prometheus-adapter.yaml")
    lines = open(path).read().splitlines()
    out, name = [], None
    for i, line in enumerate(lines):
        m = re.match(r'\s+as: "(\w+)"', line)
        if m:
            name = m.group(1)
        m = re.match(r"(\s+)metricsQuery: (.*)", line)
        if m:
            query = m.group(2)
            if query == ">-":
                parts = []
                for follow in lines[i + 1:]:
                    if len(follow) - len(follow.lstrip()) <= len(m.group(1)):
                        break
                    parts.append(follow.strip())
                query = " ".join(parts)
            out.append((name, query))
    return out


def regex_value(value):
    """A variable's value in a =~ matcher, escaped as Grafana escapes it."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\\\1", value)


class Cluster:
    """`sluice up` (the tools/up binary): one prefill and one decode worker and the router."""

    def __init__(self, logs):
        self.logs = logs
        self.http_port = free_port()
        self.base = metrics_base()
        argv = [os.path.join(ROOT, "tools", "up"), "--bin_dir=" + ROOT, "--model=" + MODEL,
                "--host=127.0.0.1", "--port=%d" % self.http_port,
                "--prefill_port=%d" % free_port(), "--decode_port=%d" % free_port(),
                "--metrics_port=%d" % self.base, "--kv_pages=4096", "--threads=1",
                "--prefill=1", "--decode=1"]
        self.out = open(os.path.join(logs, "up.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.out, stderr=subprocess.STDOUT)
        self.url = "http://127.0.0.1:%d" % self.http_port
        deadline = time.time() + 120
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("sluice up exited with %s:\n%s" % (self.proc.returncode,
                                                                      self.log()))
            try:
                if http(self.url + "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("the cluster did not become healthy:\n" + self.log())
            time.sleep(0.3)
        self.model = json.loads(http(self.url + "/v1/models")[1])["data"][0]["id"]

    def log(self):
        with open(os.path.join(self.logs, "up.log")) as f:
            return f.read()[-4000:]

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "killed"


class Prometheus:
    """A Prometheus server on a free port with deploy/prometheus/prometheus.yml, scraping every
    second, its targets replaced by the cluster's."""

    def __init__(self, logs, cluster):
        with open(os.path.join(PROMETHEUS_DIR, "prometheus.yml")) as f:
            config = f.read()
        replacements = [
            ("scrape_interval: 15s", "scrape_interval: 1s"),
            ("evaluation_interval: 15s", "evaluation_interval: 1s"),
            ('"localhost:8000"', '"127.0.0.1:%d"' % cluster.http_port),
            ('"localhost:9101"', '"127.0.0.1:%d"' % (cluster.base + 1)),
            ('"localhost:9201"', '"127.0.0.1:%d"' % (cluster.base + 101)),
        ]
        for old, new in replacements:
            if config.count(old) != 1:
                raise RuntimeError("prometheus.yml no longer has exactly one %s" % old)
            config = config.replace(old, new)
        # The `model` label is the served model's id (the GGUF's name without .gguf).
        default_model = "model: SmolLM2-135M-Instruct.Q4_1"
        if config.count(default_model) != 3:
            raise RuntimeError("prometheus.yml no longer labels its 3 jobs with %s" % default_model)
        config = config.replace(default_model, "model: " + cluster.model)
        self.dir = os.path.join(logs, "prometheus")
        os.makedirs(self.dir)
        with open(os.path.join(self.dir, "prometheus.yml"), "w") as f:
            f.write(config)
        shutil.copy(os.path.join(PROMETHEUS_DIR, "rules.yml"), self.dir)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.out = open(os.path.join(logs, "prometheus.log"), "w")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus",
             "--config.file=" + os.path.join(self.dir, "prometheus.yml"),
             "--storage.tsdb.path=" + os.path.join(self.dir, "data"),
             "--web.listen-address=127.0.0.1:%d" % self.port, "--log.level=warn"],
            stdout=self.out, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError("prometheus exited with %s:\n%s" % (self.proc.returncode,
                                                                        self.log()))
            try:
                if http(self.url + "/-/ready", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise RuntimeError("prometheus did not become ready:\n" + self.log())
            time.sleep(0.3)

    def log(self):
        with open(self.out.name) as f:
            return f.read()[-4000:]

    def api(self, path, **params):
        status, body = http("%s/api/v1/%s?%s" % (self.url, path, urllib.parse.urlencode(params)),
                            timeout=30)
        return status, json.loads(body)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return "killed"


def finite_values(result):
    """Every finite sample value of a query result (vector or matrix)."""
    values = []
    for series in result:
        samples = series.get("values") or [series["value"]]
        values += [float(v) for _, v in samples if math.isfinite(float(v))]
    return values


class LiveMonitoring(unittest.TestCase):
    cluster = prom = None

    @classmethod
    def setUpClass(cls):
        if not MODEL:
            raise unittest.SkipTest("SLUICE_MODEL is not set (./sluice test sets it)")
        if not shutil.which("prometheus"):
            raise unittest.SkipTest("no prometheus binary (Debian package `prometheus`)")
        cls.logs = tempfile.mkdtemp(prefix="sluice-monitoring-",
                                    dir=os.environ.get("TEST_TMPDIR"))
        try:
            cls.cluster = Cluster(cls.logs)
            cls.prom = Prometheus(cls.logs, cls.cluster)
            cls.wait_for_targets()
            cls.load_start = time.time()
            cls.load_results = cls.load()
            cls.load_end = time.time()
            print("load: %d requests in %.1f s" % (len(cls.load_results),
                                                   cls.load_end - cls.load_start))
            # A few more scrapes and rule evaluations after the last request.
            time.sleep(4)
            cls.now = time.time()
        except Exception:
            cls.tearDownClass()
            raise

    @classmethod
    def tearDownClass(cls):
        cls.stop_codes = {}
        if cls.prom:
            cls.stop_codes["prometheus"] = cls.prom.stop()
        if cls.cluster:
            cls.stop_codes["sluice up"] = cls.cluster.stop()

    @classmethod
    def wait_for_targets(cls):
        deadline = time.time() + 30
        while True:
            _, r = cls.prom.api("targets")
            targets = r["data"]["activeTargets"]
            if len(targets) == 3 and all(t["health"] == "up" for t in targets):
                return
            if time.time() > deadline:
                raise RuntimeError("targets not up: %s" % json.dumps(targets, indent=1))
            time.sleep(0.5)

    @classmethod
    def load(cls):
        """24 requests, 4 at a time: chat and completions, streamed and not, half of them with
        a long prompt, one on another preset."""
        def one(i):
            long = i % 2 == 0
            body = {"model": cls.cluster.model, "max_tokens": 24, "temperature": 0,
                    "stream": i % 3 == 1}
            if i == 5:
                body["kv_compression"] = "int8"
            if i % 6 == 3:
                url = cls.cluster.url + "/v1/completions"
                body["prompt"] = LONG_PROMPT if long else "The three primary colors are"
            else:
                url = cls.cluster.url + "/v1/chat/completions"
                body["messages"] = [{"role": "user", "content": LONG_PROMPT if long else
                                     "Tell me a fact about the number %d." % i}]
            return http(url, body)

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            return list(pool.map(one, range(24)))

    def query(self, expr, at):
        status, r = self.prom.api("query", query=expr, time="%.3f" % at)
        self.assertEqual(status, 200, "%s\n%s" % (expr, r.get("error")))
        self.assertEqual(r["status"], "success", expr)
        return r["data"]["result"]

    def query_range(self, expr):
        status, r = self.prom.api("query_range", query=expr, start="%.3f" % self.load_start,
                                  end="%.3f" % self.now, step="1")
        self.assertEqual(status, 200, "%s\n%s" % (expr, r.get("error")))
        return r["data"]["result"]

    def label_values(self, definition, substitutions):
        """Grafana's label_values(selector, label), as a PromQL query."""
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", definition)
        self.assertTrue(m, definition)
        selector = self.substitute(m.group(1), substitutions)
        result = self.query("group by (%s) (%s)" % (m.group(2), selector), self.now)
        return sorted(s["metric"][m.group(2)] for s in result if m.group(2) in s["metric"])

    def window(self):
        """From the start of the load to now, as a PromQL duration."""
        return "%ds" % (self.now - self.load_start + 2)

    def substitute(self, expr, variables, rate_interval=RATE_INTERVAL):
        """Grafana's variables replaced: the dashboard's, $__rate_interval, $__interval and
        $__range (the load's time range)."""
        for name, value in variables.items():
            expr = expr.replace("$" + name, regex_value(value))
        return (expr.replace("$__rate_interval", rate_interval).replace("$__interval", "1s")
                .replace("$__range", self.window()))

    def variables(self):
        return {"model": self.cluster.model, "preset": "sluice"}

    def test_the_load_was_served(self):
        for status, body in self.load_results:
            self.assertEqual(status, 200, body[:300])

    def test_every_target_is_up(self):
        result = self.query('up{job=~"sluice-.+"}', self.now)
        self.assertEqual(sorted(s["metric"]["job"] for s in result if s["value"][1] == "1"),
                         ["sluice-decode", "sluice-prefill", "sluice-router"])

    def test_dashboard_variables_resolve_to_the_cluster(self):
        defs = variable_queries()
        self.assertEqual(self.label_values(defs["model"], {}), [self.cluster.model])
        presets = self.label_values(defs["preset"], {"model": self.cluster.model})
        self.assertEqual(presets, ["int8", "sluice"])

    def test_the_load_shows_in_the_figures(self):
        window = "[%s]" % self.window()

        def value(expr):
            result = self.query(expr, self.now)
            self.assertEqual(len(result), 1, expr)
            return float(result[0]["value"][1])

        self.assertEqual(value('sum(sluice_requests_total{finish_reason=~"stop|length"})'), 24)
        self.assertGreater(value("max_over_time(sum(sluice_kv_pages_used)[%s:1s])"
                                 % self.window()), 0)
        self.assertGreater(value("increase(sluice_kv_transfer_bytes_total%s)" % window), 0)
        self.assertGreater(value('max_over_time(max(sluice_kv_compression_ratio{preset="sluice"})'
                                 "[%s:1s])" % self.window()), 1)
        self.assertGreater(value("sum(increase(sluice_request_kv_fp16_bytes_total%s)) / "
                                 "sum(increase(sluice_request_kv_bytes_total%s))"
                                 % (window, window)), 1)
        # Every page went back once the load was over.
        self.assertEqual(value("sum(sluice_kv_pages_used)"), 0)

    def test_autoscaling_metrics_evaluate_on_the_cluster(self):
        # The Prometheus adapter's templates as it fills them for one pod of a role (here the
        # scrape target stands for the pod): a series per worker, finite, and a utilization in
        # [0, 1] that the load moved.
        jobs = {"sluice_kv_pool_utilization": "sluice-decode",
                "sluice_prefill_queued_tokens": "sluice-prefill",
                "sluice_requests_waiting": "sluice-router"}
        queries = adapter_queries()
        self.assertEqual(sorted(name for name, _ in queries), sorted(jobs))
        for name, template in queries:
            query = (template.replace("<<.GroupBy>>", "instance")
                     .replace("<<.LabelMatchers>>", 'job="%s"' % jobs[name]))
            result = self.query(query, self.now)
            self.assertEqual(len(result), 1, query)  # one worker of each role here
            value = float(result[0]["value"][1])
            self.assertTrue(math.isfinite(value), query)
            if name == "sluice_kv_pool_utilization":
                self.assertTrue(0 <= value <= 1, value)
                peak = self.query("max_over_time((%s)[%s:1s])" % (query, self.window()), self.now)
                self.assertGreater(float(peak[0]["value"][1]), 0, "the load used no pages")

    def test_alert_rules_stay_quiet_on_a_healthy_cluster(self):
        _, r = self.prom.api("alerts")
        firing = [a["labels"]["alertname"] for a in r["data"]["alerts"] if a["state"] == "firing"]
        self.assertEqual(firing, [])


def add_panel_case(dashboard, title, ref, expr):
    def case(self):
        # Instant, as a stat panel asks, with rates over the whole load.
        query = self.substitute(expr, self.variables(), rate_interval=self.window())
        self.assertTrue(self.query(query, self.now), "no data: " + query)
        # Range, as a time series panel asks: data, and at least one finite value.
        query = self.substitute(expr, self.variables())
        series = self.query_range(query)
        self.assertTrue(series, "no data over the load: " + query)
        self.assertTrue(finite_values(series), "only NaN over the load: " + query)
    slug = re.sub(r"\W+", "_", "%s_%s_%s" % (dashboard[:-5], title, ref)).lower()
    case.__doc__ = "%s: %s (%s)" % (dashboard, title, ref)
    setattr(LiveMonitoring, "test_panel_" + slug, case)


def add_alert_case(name):
    def case(self):
        _, r = self.prom.api("rules", type="alert")
        rules = [rule for g in r["data"]["groups"] for rule in g["rules"] if rule["name"] == name]
        self.assertEqual(len(rules), 1, name)
        rule = rules[0]
        self.assertEqual(rule["health"], "ok", rule.get("lastError"))
        self.query(rule["query"], self.now)
    setattr(LiveMonitoring, "test_alert_rule_" + name, case)


for _target in dashboard_targets():
    add_panel_case(*_target)
for _name in alert_names():
    add_alert_case(_name)


if __name__ == "__main__":
    test_report.main(__name__, "monitoring_live")
