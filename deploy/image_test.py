"""The container image: tools/image.sh builds deploy/docker/Dockerfile with buildah on a Debian 12
base made by mmdebstrap, and the router and both workers are started from the image's own
filesystem (`buildah run` with chroot isolation, one container per role, the host's network),
with the commands and arguments the Kubernetes manifests give them (the cpu overlay, rendered by
`kubectl kustomize`; only ports and the files of Secrets differ). A chat completion goes through
them. The image's user is not root, the processes run as that user, the model's SHA-256 is the one
tools/fetch_model.sh pins, and no build tool is left in the image.

Needs root, buildah and mmdebstrap (`tools/setup.sh --image`, which `./sluice test` runs), and the
Debian mirror and PyPI (the image fetches the model and cuBLAS at build time). Skips when not root.
"""

import glob
import hashlib
import json
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
import urllib.request

sys.path.insert(0, os.getcwd())

try:
    import yaml
except ImportError:
    yaml = None
    PY = os.environ.get("SLUICE_CLIENT_PYTHON")
    if PY and not os.environ.get("SLUICE_IMAGE_TEST_REEXEC"):
        os.environ["SLUICE_IMAGE_TEST_REEXEC"] = "1"
        os.execv(PY, [PY, os.path.abspath(__file__)] + sys.argv[1:])

from deploy import test_report  # noqa: E402
from deploy.test_net import free_port  # noqa: E402

TAG = "localhost/sluice:image-test"
USER = "10001:10001"
# Where the manifests mount the two Secrets.
TOKEN_PATH = "/var/run/sluice/cluster-token/token"
API_KEY_PATH = "/var/run/sluice/api-key/key"
# The image holds the three binaries, their shared libraries, cuBLAS and the model; 1.11 GB when
# first built (cuBLAS is 0.6 GB of it).
MAX_IMAGE_BYTES = 1.3e9
# What must not be in the image: compilers, headers, package fetchers, the build's toolchains.
BUILD_TOOLS = ("usr/bin/gcc", "usr/bin/g++", "usr/bin/cc", "usr/bin/ld", "usr/bin/make",
               "usr/bin/python3", "usr/bin/pip3", "usr/bin/bazel", "usr/local/cuda",
               "usr/include/c++", "usr/include/grpc++", "opt/sluice/bin/up")


def run(cmd, timeout=600, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if out.returncode != 0:
        raise AssertionError("%s failed (%d):\n%s%s" % (" ".join(cmd), out.returncode,
                                                      out.stdout[-4000:], out.stderr[-4000:]))
    return out.stdout


def render_cpu_overlay():
    """The cpu overlay's objects, rendered from a copy (kustomize reads no runfiles' links)."""
    tree = os.path.join(tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR")), "k8s")
    shutil.copytree(os.path.join(os.getcwd(), "deploy", "k8s"), tree)
    text = run(["kubectl", "kustomize", os.path.join(tree, "overlays", "cpu")], timeout=120)
    return [d for d in yaml.safe_load_all(text) if d]


def container_command(objects, workload):
    """The command and arguments of `workload`'s first container, $(VAR)s replaced by the
    ConfigMap's values and the pod's name."""
    config = next(o for o in objects if o["kind"] == "ConfigMap")["data"]
    obj = next(o for o in objects if o["kind"] in ("Deployment", "StatefulSet")
               and o["metadata"]["name"] == workload)
    c = obj["spec"]["template"]["spec"]["containers"][0]
    values = dict(config, POD_NAME=workload + "-0")
    expand = lambda a: re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a)  # noqa: E731
    return [expand(a) for a in c["command"] + c.get("args", [])]


def with_flags(cmd, **flags):
    """`cmd` with --name=value set for each flag (replaced where present)."""
    out = [a for a in cmd if a.split("=", 1)[0].lstrip("-") not in flags]
    return out + ["--%s=%s" % (k, v) for k, v in flags.items()]


def model_sha256():
    with open(os.path.join("tools", "fetch_model.sh")) as f:
        return re.search(r'^MODEL_SHA256="([0-9a-f]{64})"', f.read(), re.M).group(1)


def pids_of(binary):
    """Pids of running processes whose command starts with `binary` (a path in the image)."""
    pids = []
    for status in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            with open(status, "rb") as f:
                argv0 = f.read().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if argv0 == binary:
            pids.append(int(status.split("/")[2]))
    return pids


def uid_of(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(re.search(r"^Uid:\s+(\d+)", f.read(), re.M).group(1))


@unittest.skipIf(os.geteuid() != 0, "building and running the image needs root (buildah's chroot "
                 "isolation)")
class Image(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if yaml is None:
            raise unittest.SkipTest("PyYAML is missing (set SLUICE_CLIENT_PYTHON)")
        for tool in ("buildah", "mmdebstrap", "kubectl"):
            if shutil.which(tool) is None:
                raise AssertionError("%s is not installed (tools/setup.sh --image)" % tool)
        cls.containers, cls.procs, cls.logs = [], [], {}
        cls.tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
        start = time.time()
        run(["tools/image.sh", "--tag", TAG, "--bin", os.getcwd()], timeout=1800)
        cls.build_s = time.time() - start
        try:
            cls.start_cluster()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def start_cluster(cls):
        objects = render_cpu_overlay()
        secrets = os.path.join(cls.tmp, "secrets")
        for path, value in ((TOKEN_PATH, "image-test-cluster-token-0123"),
                            (API_KEY_PATH, "image-test-api-key-0123")):
            os.makedirs(os.path.dirname(secrets + path), exist_ok=True)
            with open(secrets + path, "w") as f:
                f.write(value)
            os.chmod(secrets + path, 0o644)
        cls.api_key = "image-test-api-key-0123"
        ports = {r: free_port() for r in ("prefill", "decode", "router", "prefill_m", "decode_m",
                                          "router_m")}
        cls.ports = ports
        # The router finds the workers by DNS names, as in the cluster: the containers' /etc/hosts
        # names them on the loopback address.
        commands = {
            "decode": with_flags(container_command(objects, "sluice-decode"), host="127.0.0.1",
                                 port=ports["decode"], metrics_port=ports["decode_m"],
                                 threads=1),
            "prefill": with_flags(container_command(objects, "sluice-prefill"), host="127.0.0.1",
                                  port=ports["prefill"], metrics_port=ports["prefill_m"],
                                  threads=1),
            "router": with_flags(container_command(objects, "sluice-router"), host="127.0.0.1",
                                 port=ports["router"], metrics_port=ports["router_m"],
                                 prefill="dns:sluice-prefill:%d" % ports["prefill"],
                                 decode="dns:sluice-decode:%d" % ports["decode"]),
        }
        cls.commands = commands
        for role in ("decode", "prefill", "router"):
            # A container a killed run left behind holds the name.
            subprocess.run(["buildah", "rm", "sluice-image-test-" + role], capture_output=True)
            ctr = run(["buildah", "from", "--pull=never", "--name", "sluice-image-test-" + role,
                       "--add-host", "sluice-prefill:127.0.0.1",
                       "--add-host", "sluice-decode:127.0.0.1", TAG]).strip()
            cls.containers.append(ctr)
            log = open(os.path.join(cls.tmp, role + ".log"), "w")
            cls.logs[role] = log.name
            # No --user: the image's own USER applies.
            cls.procs.append(subprocess.Popen(
                ["buildah", "run", "--isolation", "chroot", "--network", "host",
                 # /var/run is a link to /run in the image.
                 "--volume", "%s/var/run/sluice:/run/sluice:ro" % secrets, ctr, "--"]
                + commands[role], stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        deadline = time.time() + 300
        while time.time() < deadline:
            for p, role in zip(cls.procs, ("decode", "prefill", "router")):
                if p.poll() is not None:
                    raise AssertionError("%s exited (%d) at start:\n%s" %
                                         (role, p.returncode, cls.log_tail(role)))
            status, text = cls.get("/v1/workers")
            if status == 200 and sum(bool(w.get("ready"))
                                     for w in json.loads(text).get("workers", [])) == 2:
                return
            time.sleep(1)
        raise AssertionError("the cluster from the image did not come up in 300 s:\n%s" %
                             "\n".join(cls.log_tail(r) for r in cls.logs))

    @classmethod
    def log_tail(cls, role):
        with open(cls.logs[role], errors="replace") as f:
            return "--- %s ---\n%s" % (role, f.read()[-3000:])

    @classmethod
    def get(cls, path, body=None):
        req = urllib.request.Request(
            "http://127.0.0.1:%d%s" % (cls.ports["router"], path),
            data=None if body is None else json.dumps(body).encode(),
            headers={"Content-Type": "application/json",
                     "Authorization": "Bearer " + cls.api_key})
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except OSError as e:
            return 0, str(e)

    @classmethod
    def tearDownClass(cls):
        for p in cls.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in cls.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for binary in ("/opt/sluice/bin/router", "/opt/sluice/bin/prefill",
                       "/opt/sluice/bin/decode"):
            for pid in pids_of(binary):
                os.kill(pid, signal.SIGKILL)
        for ctr in cls.containers:
            subprocess.run(["buildah", "rm", ctr], capture_output=True)

    def test_serves_a_chat_completion(self):
        status, text = self.get("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 8, "temperature": 0})
        self.assertEqual(status, 200, text)
        body = json.loads(text)
        self.assertTrue(body["choices"][0]["message"]["content"], body)
        self.assertGreater(body["usage"]["completion_tokens"], 0, body)
        # Without the API key the router refuses.
        req = urllib.request.Request("http://127.0.0.1:%d/v1/models" % self.ports["router"])
        with self.assertRaises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        self.assertEqual(e.exception.code, 401)

    def test_runs_as_its_non_root_user(self):
        user = run(["buildah", "inspect", "--type", "image", "--format",
                    "{{.OCIv1.Config.User}}", TAG]).strip()
        self.assertEqual(user, USER)
        for binary in ("/opt/sluice/bin/router", "/opt/sluice/bin/prefill",
                       "/opt/sluice/bin/decode"):
            pids = pids_of(binary)
            self.assertTrue(pids, "%s is not running" % binary)
            for pid in pids:
                self.assertEqual(uid_of(pid), 10001, "%s (pid %d)" % (binary, pid))

    def test_holds_the_pinned_model(self):
        root = run(["buildah", "mount", self.containers[0]]).strip()
        try:
            info = json.loads(run(["buildah", "inspect", "--type", "image", TAG]))
            env = info["OCIv1"]["config"]["Env"]
            model = next(e.split("=", 1)[1] for e in env if e.startswith("SLUICE_MODEL="))
            h = hashlib.sha256()
            with open(root + model, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
            self.assertEqual(h.hexdigest(), model_sha256(), model)
        finally:
            subprocess.run(["buildah", "umount", self.containers[0]], capture_output=True)

    def test_is_small_and_holds_no_build_tools(self):
        root = run(["buildah", "mount", self.containers[0]]).strip()
        try:
            present = [p for p in BUILD_TOOLS if os.path.lexists(os.path.join(root, p))]
            self.assertEqual(present, [], "build tools in the image")
            self.assertFalse(glob.glob(os.path.join(root, "var/lib/apt/lists/*_Packages")),
                             "apt's package lists were left in the image")
            # Bytes of the image's files, unpacked (what `du -sb` counts).
            total = int(run(["du", "-sb", "--one-file-system", root]).split()[0])
        finally:
            subprocess.run(["buildah", "umount", self.containers[0]], capture_output=True)
        print("image %s: %.2f GB unpacked, built in %.0f s" % (TAG, total / 1e9, self.build_s))
        self.assertLess(total, MAX_IMAGE_BYTES)


if __name__ == "__main__":
    test_report.main(__name__, "image")
