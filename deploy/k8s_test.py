"""The Kubernetes manifests: each overlay of deploy/k8s builds with `kubectl kustomize`, every
object validates (strictly: unknown fields are errors) against the API schemas of a pinned
Kubernetes version, and the objects fit together: selectors select pods, named ports exist,
the router finds the StatefulSets' pods by their headless Services, autoscalers read metrics the adapter serves, every $(VAR) in a container's
arguments is defined.

Needs `kubectl` on PATH (Debian's kubernetes-client, or any later kubectl) and
SLUICE_CLIENT_PYTHON, a python with kubernetes-validate and PyYAML
(tests/setup_client_venv.sh, which `./sluice test` runs); skips without the latter.
"""

import copy
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.getcwd())

try:
    import kubernetes_validate
    import yaml
except ImportError:
    kubernetes_validate = yaml = None
    PY = os.environ.get("SLUICE_CLIENT_PYTHON")
    if PY and not os.environ.get("SLUICE_K8S_TEST_REEXEC"):
        os.environ["SLUICE_K8S_TEST_REEXEC"] = "1"
        os.execv(PY, [PY, os.path.abspath(__file__)] + sys.argv[1:])

from deploy import test_report  # noqa: E402

# The Kubernetes version the manifests must be valid for.
KUBERNETES_VERSION = "1.29.0"
OVERLAYS = ("cpu", "gpu", "gpu-autoscaling")
# Kinds of the Prometheus Operator's CRDs, which kubernetes-validate has no schema for; their
# fields are checked below against the objects they refer to.
CUSTOM_KINDS = {("monitoring.coreos.com/v1", "PodMonitor")}
K8S_DIR = os.path.join(os.getcwd(), "deploy", "k8s")


def build(overlay):
    # kustomize does not read files through symbolic links (as runfiles are): build a copy.
    tree = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "k8s")
    shutil.copytree(K8S_DIR, tree)
    out = subprocess.run(["kubectl", "kustomize", os.path.join(tree, "overlays", overlay)],
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise AssertionError("kubectl kustomize %s failed:\n%s" % (overlay, out.stderr))
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def pod_templates(objects):
    """(workload, pod template) of every Deployment and StatefulSet."""
    return [(o, o["spec"]["template"]) for o in objects
            if o["kind"] in ("Deployment", "StatefulSet")]


def selects(match_labels, labels):
    return all(labels.get(k) == v for k, v in match_labels.items())


def matches_selector(selector, labels):
    """A LabelSelector (matchLabels and matchExpressions with In/NotIn/Exists)."""
    if not selects(selector.get("matchLabels", {}), labels):
        return False
    for e in selector.get("matchExpressions", []):
        key, op, values = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and labels.get(key) in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def container_ports(template):
    return {p["name"]: p["containerPort"] for c in template["spec"]["containers"]
            for p in c.get("ports", [])}


def by_kind(objects, kind):
    return [o for o in objects if o["kind"] == kind]


def named(objects, kind, name):
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(found) != 1:
        raise AssertionError("expected one %s %s, found %d" % (kind, name, len(found)))
    return found[0]


class Overlay:
    """Cases run for each overlay (mixed into one TestCase class per overlay)."""

    overlay = None

    @classmethod
    def setUpClass(cls):
        if yaml is None:
            raise unittest.SkipTest("SLUICE_CLIENT_PYTHON is not set (./sluice test sets it)")
        cls.objects = build(cls.overlay)

    def test_every_object_validates_against_the_pinned_kubernetes_version(self):
        kinds = set()
        for o in self.objects:
            kinds.add(o["kind"])
            if (o["apiVersion"], o["kind"]) in CUSTOM_KINDS:
                continue
            try:
                kubernetes_validate.validate(o, KUBERNETES_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:
                self.fail("%s/%s: %s: %s" % (o["kind"], o["metadata"]["name"],
                                             ".".join(str(p) for p in e.path), e.message))
            except kubernetes_validate.SchemaNotFoundError as e:
                self.fail(e.message)
        for kind in ("Deployment", "StatefulSet", "Service", "ConfigMap", "PodDisruptionBudget",
                     "NetworkPolicy", "PodMonitor"):
            self.assertIn(kind, kinds)

    def test_the_validator_rejects_a_broken_object(self):
        # The check above can fail: a misspelt field and a wrongly typed one are both caught.
        router = copy.deepcopy(named(self.objects, "Deployment", "sluice-router"))
        router["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(router, KUBERNETES_VERSION, strict=True)
        router = copy.deepcopy(named(self.objects, "Deployment", "sluice-router"))
        router["spec"]["replicas"] = "two"
        with self.assertRaises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(router, KUBERNETES_VERSION, strict=True)

    def test_selectors_select_pods_and_named_ports_exist(self):
        templates = pod_templates(self.objects)
        for w, t in templates:
            self.assertTrue(selects(w["spec"]["selector"]["matchLabels"], t["metadata"]["labels"]),
                            w["metadata"]["name"])
        for s in by_kind(self.objects, "Service"):
            pods = [t for _, t in templates if selects(s["spec"]["selector"],
                                                       t["metadata"]["labels"])]
            self.assertEqual(len(pods), 1, "Service %s selects %d pod templates"
                             % (s["metadata"]["name"], len(pods)))
            for p in s["spec"]["ports"]:
                self.assertIn(p["targetPort"], container_ports(pods[0]), s["metadata"]["name"])
        for kind in ("PodDisruptionBudget", "NetworkPolicy"):
            for o in by_kind(self.objects, kind):
                sel = o["spec"]["selector"] if kind == "PodDisruptionBudget" else o["spec"]["podSelector"]
                pods = [t for _, t in templates if matches_selector(sel, t["metadata"]["labels"])]
                self.assertTrue(pods, "%s %s selects no pod" % (kind, o["metadata"]["name"]))
                for rule in o["spec"].get("ingress", []):
                    for port in rule.get("ports", []):
                        if isinstance(port.get("port"), str):
                            for t in pods:
                                self.assertIn(port["port"], container_ports(t),
                                              o["metadata"]["name"])

    def test_autoscalers_scale_workloads_on_metrics_the_adapter_serves(self):
        hpas = by_kind(self.objects, "HorizontalPodAutoscaler")
        if not hpas:
            return  # an overlay without ../../autoscaling
        workloads = {(o["kind"], o["metadata"]["name"]) for o in self.objects}
        adapter = [c for c in by_kind(self.objects, "ConfigMap")
                   if c["metadata"]["name"].startswith("sluice-prometheus-adapter")]
        self.assertEqual(len(adapter), 1)
        rules = yaml.safe_load(adapter[0]["data"]["config.yaml"])
        served = {"Pods": {r["name"]["as"] for r in rules["rules"]},
                  "External": {r["name"]["as"] for r in rules["externalRules"]}}
        self.assertEqual({h["spec"]["scaleTargetRef"]["name"] for h in hpas},
                         {"sluice-prefill", "sluice-decode"})
        for h in hpas:
            ref = h["spec"]["scaleTargetRef"]
            self.assertIn((ref["kind"], ref["name"]), workloads)
            for m in h["spec"]["metrics"]:
                name = m[m["type"].lower()]["metric"]["name"]
                self.assertIn(name, served[m["type"]], h["metadata"]["name"])

    def test_probes_use_ports_the_containers_declare(self):
        for w, t in pod_templates(self.objects):
            for c in t["spec"]["containers"]:
                ports = container_ports(t)
                for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                    self.assertIn(probe, c, "%s has no %s" % (c["name"], probe))
                    if "grpc" in c[probe]:
                        # Native gRPC probes name the port by number, and a health service.
                        self.assertIn(c[probe]["grpc"]["port"], ports.values(),
                                      "%s %s" % (c["name"], probe))
                        self.assertIn(c[probe]["grpc"]["service"], ("liveness", "readiness"))
                        continue
                    handler = c[probe].get("httpGet") or c[probe].get("tcpSocket")
                    self.assertIn(handler["port"], ports, "%s %s" % (c["name"], probe))
                res = c["resources"]
                self.assertIn("cpu", res["requests"])
                self.assertIn("memory", res["limits"])
            # The workers' readiness and liveness are their grpc.health.v1 services.
            if w["metadata"]["name"] in ("sluice-prefill", "sluice-decode"):
                c = t["spec"]["containers"][0]
                self.assertEqual(c["readinessProbe"]["grpc"]["service"], "readiness")
                self.assertEqual(c["livenessProbe"]["grpc"]["service"], "liveness")
            # The router's readiness is its /health (503 until workers answer).
            if w["metadata"]["name"] == "sluice-router":
                self.assertEqual(t["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"],
                                 "/health")

    def test_every_pod_carries_the_cluster_token_from_its_secret(self):
        # The gRPC calls between the pods carry a token the workers check: every sluice pod
        # reads it from the sluice-cluster-token Secret, mounted where its flag points.
        for w, t in pod_templates(self.objects):
            c = t["spec"]["containers"][0]
            flags = [a for a in c["args"] if a.startswith("--auth_token_file=")]
            self.assertEqual(len(flags), 1, w["metadata"]["name"])
            path = flags[0].split("=", 1)[1]
            volumes = {v["name"]: v for v in t["spec"]["volumes"]}
            mounts = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
            self.assertEqual(len(mounts), 1, (w["metadata"]["name"], path))
            volume = volumes[mounts[0]["name"]]
            self.assertEqual(volume["secret"]["secretName"], "sluice-cluster-token")
            self.assertEqual(t["spec"]["securityContext"]["fsGroup"],
                             t["spec"]["securityContext"]["runAsGroup"])

    def test_the_router_requires_an_api_key_from_its_secret(self):
        # Clients of the router's API send the key of the sluice-api-key Secret; the router
        # reads it from the Secret, mounted where its flag points, and has no other key flag.
        routers = [(w, t) for w, t in pod_templates(self.objects)
                   if w["metadata"]["name"] == "sluice-router"]
        self.assertEqual(len(routers), 1)
        _, t = routers[0]
        c = t["spec"]["containers"][0]
        flags = [a for a in c["args"] if a.startswith("--api_key")]
        self.assertEqual(len(flags), 1, flags)
        self.assertTrue(flags[0].startswith("--api_key_file="), flags)
        path = flags[0].split("=", 1)[1]
        mounts = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
        self.assertEqual(len(mounts), 1, path)
        volume = {v["name"]: v for v in t["spec"]["volumes"]}[mounts[0]["name"]]
        self.assertEqual(volume["secret"]["secretName"], "sluice-api-key")
        self.assertEqual(path.rsplit("/", 1)[1], "key")

    def test_container_arguments_only_use_defined_variables(self):
        configmaps = {c["metadata"]["name"]: c["data"] for c in by_kind(self.objects, "ConfigMap")}
        for w, t in pod_templates(self.objects):
            for c in t["spec"]["containers"]:
                defined = {e["name"] for e in c.get("env", [])}
                for src in c.get("envFrom", []):
                    self.assertIn(src["configMapRef"]["name"], configmaps)
                    defined |= set(configmaps[src["configMapRef"]["name"]])
                for arg in c.get("command", []) + c.get("args", []):
                    for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg):
                        self.assertIn(var, defined, "%s: %s" % (c["name"], arg))

    def test_router_finds_every_worker_pod_by_its_headless_service(self):
        config = [c for c in by_kind(self.objects, "ConfigMap")
                  if c["metadata"]["name"].startswith("sluice-config")][0]["data"]
        for role, port in (("prefill", "grpc"), ("decode", "grpc")):
            sts = named(self.objects, "StatefulSet", "sluice-" + role)
            svc = named(self.objects, "Service", sts["spec"]["serviceName"])
            self.assertEqual(svc["spec"]["clusterIP"], "None")
            # Every pod, ready or not: the router's own polls decide which take requests.
            self.assertTrue(svc["spec"]["publishNotReadyAddresses"])
            grpc = container_ports(sts["spec"]["template"])[port]
            self.assertEqual(config["SLUICE_" + role.upper()],
                             "dns:%s:%d" % (svc["metadata"]["name"], grpc))

    def test_one_image_for_every_role(self):
        images = {c["image"] for _, t in pod_templates(self.objects)
                  for c in t["spec"]["containers"]}
        self.assertEqual(images, {"sluice:latest"})
        commands = sorted(t["spec"]["containers"][0]["command"][0]
                          for _, t in pod_templates(self.objects))
        self.assertEqual(commands, ["/opt/sluice/bin/decode", "/opt/sluice/bin/prefill",
                                    "/opt/sluice/bin/router"])

    def test_podmonitor_scrapes_every_pod_with_job_and_model_labels(self):
        pm = named(self.objects, "PodMonitor", "sluice")
        templates = [t for _, t in pod_templates(self.objects)
                     if selects(pm["spec"]["selector"]["matchLabels"], t["metadata"]["labels"])]
        self.assertEqual(len(templates), 3)
        endpoints = {e["port"]: e for e in pm["spec"]["podMetricsEndpoints"]}
        for t in templates:
            scraped = [p for p in container_ports(t) if p in endpoints]
            self.assertEqual(len(scraped), 1, t["metadata"]["labels"])
            targets = set()
            for r in endpoints[scraped[0]]["relabelings"]:
                targets.add(r["targetLabel"])
                for src in r["sourceLabels"]:
                    m = re.match(r"__meta_kubernetes_pod_label_(.*)", src)
                    if m:
                        keys = {re.sub(r"[^a-zA-Z0-9_]", "_", k) for k in t["metadata"]["labels"]}
                        self.assertIn(m.group(1), keys)
            self.assertTrue({"job", "model"} <= targets)

    def test_network_policy_admits_worker_traffic_only_from_sluice_pods(self):
        workers = named(self.objects, "NetworkPolicy", "sluice-workers")
        for rule in workers["spec"]["ingress"]:
            ports = {p.get("port") for p in rule["ports"]}
            if "from" in rule:
                self.assertEqual(rule["from"], [{"podSelector": {"matchLabels": {
                    "app.kubernetes.io/part-of": "sluice"}}}])
            else:
                # From anywhere: only the metrics port.
                self.assertEqual(ports, {"metrics"})


class CpuOverlay(Overlay, unittest.TestCase):
    overlay = "cpu"

    def test_no_gpus(self):
        for _, t in pod_templates(self.objects):
            for c in t["spec"]["containers"]:
                self.assertNotIn("nvidia.com/gpu", c["resources"].get("limits", {}))


class GpuOverlay(Overlay, unittest.TestCase):
    overlay = "gpu"

    def test_workers_get_a_gpu_a_gpu_node_and_shared_memory(self):
        for role in ("prefill", "decode"):
            t = named(self.objects, "StatefulSet", "sluice-" + role)["spec"]["template"]
            c = t["spec"]["containers"][0]
            self.assertEqual(str(c["resources"]["limits"]["nvidia.com/gpu"]), "1")
            self.assertEqual(str(c["resources"]["requests"]["nvidia.com/gpu"]), "1")
            self.assertEqual(t["spec"]["nodeSelector"], {"nvidia.com/gpu.present": "true"})
            self.assertIn("nvidia.com/gpu", [x["key"] for x in t["spec"]["tolerations"]])
            shm = [m for m in c["volumeMounts"] if m["mountPath"] == "/dev/shm"]
            self.assertEqual(len(shm), 1)
            vol = [v for v in t["spec"]["volumes"] if v["name"] == shm[0]["name"]][0]
            self.assertEqual(vol["emptyDir"]["medium"], "Memory")
        router = named(self.objects, "Deployment", "sluice-router")["spec"]["template"]
        self.assertNotIn("nvidia.com/gpu", router["spec"]["containers"][0]["resources"]["limits"])


class GpuAutoscalingOverlay(Overlay, unittest.TestCase):
    overlay = "gpu-autoscaling"

    def test_both_worker_roles_autoscale(self):
        hpas = by_kind(self.objects, "HorizontalPodAutoscaler")
        self.assertEqual(sorted(h["metadata"]["name"] for h in hpas),
                         ["sluice-decode", "sluice-prefill"])


if __name__ == "__main__":
    test_report.main(__name__, "k8s")
