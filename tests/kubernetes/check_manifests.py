"""Checks deploy/kubernetes/ against the relay it deploys, without a cluster.

scripts/test runs it with the Python of .tools/kubernetes-venv (PyYAML and kubernetes-validate,
which ships the Kubernetes API's JSON schemas) and the binary it built:

    python tests/kubernetes/check_manifests.py --relay target/debug/outbox-relay

Every check prints one `ok`, `FAIL` or `skip` line; the last line counts them. The checks:

- every manifest parses, and every object names its apiVersion, kind and name;
- deployment.yaml runs the relay as a native sidecar (an init container with restartPolicy
  Always, not a regular container), deployment-plain.yaml as a regular container;
- in both: the probes ask /healthz (the relay's semantics: loop alive) on the port the relay
  listens on (--metrics-addr, or its default when unset), there is no readiness probe (the
  documented choice), every environment variable is one of the command's own (from its
  `--help`) or the AWS chain's, the database URL comes from a Secret, the user is the image's
  (65532, deploy/Dockerfile), and terminationGracePeriodSeconds exceeds --drain-timeout (in the
  native variant with the app's shutdown allowance on top, since the app stops first);
- the migration Job runs `migrate` with `migrate`'s own variables; the PodMonitor selects the
  Deployment's pods and scrapes a port the relay declares;
- both Deployments roll out with RollingUpdate, maxUnavailable 0 and maxSurge at least 1 (a new
  pod is ready before an old one stops, docs/operations.md "Upgrading"); the
  PodDisruptionBudget selects their pods and, with maxUnavailable (not minAvailable), leaves at
  least one of their replicas running through an eviction;
- the Kubernetes API schemas (strict: unknown fields fail): the native variant against 1.29,
  the first version with native sidecars, the plain one, the Job and the PodDisruptionBudget
  against the oldest schema shipped; all of them against the newest;
- where a kubectl of 1.29 or newer is installed, a client-side round trip through its API types
  (`kubectl set env --local`, which needs no cluster) keeps every field; otherwise a `skip`
  line says so. `kubectl apply/create --dry-run=client` are not used: they need the API
  server's discovery even with --validate=false, so they fail without a cluster;
- the checks themselves: each one is fed a broken copy of the manifests and must fail.
"""

import argparse
import copy
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import yaml

REPO = Path(__file__).resolve().parents[2]
MANIFESTS = REPO / "deploy" / "kubernetes"
NATIVE = "deployment.yaml"
PLAIN = "deployment-plain.yaml"
MIGRATE = "migrate-job.yaml"
PODMONITOR = "podmonitor.yaml"
PDB = "poddisruptionbudget.yaml"
RELAY_CONTAINER = "outbox-relay"
# deploy/Dockerfile: USER 65532:65532.
IMAGE_UID = 65532
# Native sidecars (initContainers[].restartPolicy) exist from this version on.
NATIVE_SINCE = "1.29.0"
# The schemas kubernetes-validate ships go back to here; plain containers are much older.
OLDEST_SCHEMA = "1.25.0"
# The app's own shutdown comes before the relay's drain in the native variant's grace period
# (deployment.yaml says how much it allows for it).
APP_SHUTDOWN_ALLOWANCE = 20
# Variables the relay reads through the AWS SDK's standard chain rather than its own flags.
AWS_CHAIN = {
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_PROFILE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_ROLE_ARN",
    "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
    "AWS_STS_REGIONAL_ENDPOINTS",
    "AWS_ENDPOINT_URL",
    "AWS_EC2_METADATA_DISABLED",
}


class Failed(Exception):
    pass


def need(condition, why):
    if not condition:
        raise Failed(why)


def fail(why):
    raise Failed(why)


# --- what the binary says about itself -------------------------------------------------------


class Command:
    """One subcommand's options as its `--help` lists them."""

    def __init__(self, help_text):
        self.envs = set()
        self.defaults = {}
        block = []
        for line in help_text.splitlines() + [""]:
            if re.match(r"^\s+(-\w, )?--[a-z]", line) or not line.startswith(" "):
                self._take(block)
                block = []
            block.append(line)
        self._take(block)
        need(self.envs, "no [env: ...] in the --help output: has its format changed?")

    def _take(self, block):
        text = " ".join(block)
        long = re.search(r"--([a-z][a-z0-9-]*)", block[0]) if block else None
        for env in re.findall(r"\[env: ([A-Z0-9_]+)[=\]]", text):
            self.envs.add(env)
        default = re.search(r"\[default: ([^\]]*)\]", text)
        if long and default:
            self.defaults[long.group(1)] = default.group(1)


def commands(relay):
    def help_of(*path):
        out = subprocess.run(
            [relay, *path, "--help"], capture_output=True, text=True, timeout=30, check=True
        )
        return out.stdout

    top = help_of()
    names = re.findall(r"^  ([a-z]+)\s", top.split("Commands:")[1].split("Options:")[0], re.M)
    return {name: Command(help_of(name)) for name in names if name != "help"}


def seconds(duration):
    """A humantime duration as the relay's flags take it, in the forms the manifests use."""
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)", duration)
    need(parts and "".join(n + u for n, u in parts) == duration.replace(" ", ""),
         f"cannot read the duration {duration!r}")
    for number, unit in parts:
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


# --- reading manifests -----------------------------------------------------------------------


def load(path):
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def one(docs, kind):
    found = [d for d in docs if d.get("kind") == kind]
    need(len(found) == 1, f"expected one {kind}, found {len(found)}")
    return found[0]


def pod_spec(docs):
    for kind in ("Deployment", "Job"):
        found = [d for d in docs if d.get("kind") == kind]
        if found:
            return found[0]["spec"]["template"]["spec"]
    raise Failed("no Deployment or Job")


def relay_container(spec, where):
    found = [c for c in spec.get(where) or [] if c.get("name") == RELAY_CONTAINER]
    need(len(found) == 1, f"expected the {RELAY_CONTAINER} container once in {where}")
    return found[0]


def env_of(container):
    return {e["name"]: e for e in container.get("env") or []}


def listen_port(container, run):
    """The port the relay listens on: OUTBOX_METRICS_ADDR, else --metrics-addr's default."""
    env = env_of(container).get("OUTBOX_METRICS_ADDR")
    addr = env["value"] if env else run.defaults["metrics-addr"]
    return int(addr.rsplit(":", 1)[1])


def drain_timeout(container, run):
    env = env_of(container).get("OUTBOX_DRAIN_TIMEOUT")
    return seconds(env["value"] if env else run.defaults["drain-timeout"])


def probe_port(container, probe):
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    named = [p for p in container.get("ports") or [] if p.get("name") == port]
    need(named, f"the probe's port {port!r} is not a named port of the container")
    return named[0]["containerPort"]


# --- the checks ------------------------------------------------------------------------------


def check_parse(files):
    for name, docs in files.items():
        need(docs, f"{name}: no YAML documents")
        for doc in docs:
            need(isinstance(doc, dict), f"{name}: a document is not a mapping")
            for key in ("apiVersion", "kind"):
                need(doc.get(key), f"{name}: a document has no {key}")
            need((doc.get("metadata") or {}).get("name"), f"{name}: a {doc['kind']} has no name")


def check_native_is_sidecar(files):
    spec = pod_spec(files[NATIVE])
    relay = relay_container(spec, "initContainers")
    need(relay.get("restartPolicy") == "Always",
         "the relay's init container needs restartPolicy: Always (else it must finish before the app starts)")
    need(all(c.get("name") != RELAY_CONTAINER for c in spec.get("containers") or []),
         "the relay is also a regular container")
    need(spec.get("containers"), "no application container")


def check_plain_is_container(files):
    spec = pod_spec(files[PLAIN])
    relay = relay_container(spec, "containers")
    need("restartPolicy" not in relay, "a regular container takes no restartPolicy before 1.29")
    need(not spec.get("initContainers"), "the plain variant has init containers")


def check_relay(files, name, where, run):
    """What both Deployment variants must say about the relay."""
    docs = files[name]
    spec = pod_spec(docs)
    relay = relay_container(spec, where)
    need(relay.get("args", [None])[0] == "run", f"{name}: the relay's args must start with run")

    port = listen_port(relay, run)
    for kind in ("startupProbe", "livenessProbe"):
        probe = relay.get(kind)
        need(probe and "httpGet" in probe, f"{name}: the relay has no HTTP {kind}")
        need(probe["httpGet"].get("path") == "/healthz",
             f"{name}: {kind} asks {probe['httpGet'].get('path')}, the relay's liveness is /healthz")
        need(probe_port(relay, probe) == port,
             f"{name}: {kind} asks port {probe_port(relay, probe)}, the relay listens on {port}")
    need("readinessProbe" not in relay,
         f"{name}: a readiness probe on the relay takes the app's pods out of their Service while SQS or the database is down (see the manifest's note)")
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"].get("annotations") or {}
    if "prometheus.io/port" in annotations:
        need(int(annotations["prometheus.io/port"]) == port,
             f"{name}: prometheus.io/port is {annotations['prometheus.io/port']}, the relay listens on {port}")
    need(any(p.get("name") == "metrics" and p.get("containerPort") == port for p in relay.get("ports") or []),
         f"{name}: no port named metrics at {port} (podmonitor.yaml scrapes it)")

    unknown = sorted(set(env_of(relay)) - run.envs - AWS_CHAIN)
    need(not unknown, f"{name}: `outbox-relay run` reads no variable {', '.join(unknown)}")
    database = env_of(relay).get("DATABASE_URL")
    need(database and "secretKeyRef" in (database.get("valueFrom") or {}),
         f"{name}: DATABASE_URL must come from a Secret, not a literal")

    for context in (spec.get("securityContext") or {}, relay.get("securityContext") or {}):
        if "runAsUser" in context:
            need(context["runAsUser"] == IMAGE_UID, f"{name}: runAsUser {context['runAsUser']}, the image's user is {IMAGE_UID}")
    need((spec.get("securityContext") or {}).get("runAsNonRoot") or (relay.get("securityContext") or {}).get("runAsNonRoot"),
         f"{name}: runAsNonRoot is not set")

    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = drain_timeout(relay, run)
    needed = drain + (APP_SHUTDOWN_ALLOWANCE if where == "initContainers" else 0)
    need(grace > needed,
         f"{name}: terminationGracePeriodSeconds {grace} must exceed {needed:g}s (drain timeout {drain:g}s"
         + (f" after the app's {APP_SHUTDOWN_ALLOWANCE}s" if where == "initContainers" else "") + ")")


def check_migrate(files, migrate):
    spec = pod_spec(files[MIGRATE])
    container = [c for c in spec["containers"] if c.get("name") == "migrate"]
    need(container, "migrate-job.yaml: no container named migrate")
    container = container[0]
    need(container.get("args", [None])[0] == "migrate", "migrate-job.yaml: args must start with migrate")
    unknown = sorted(set(env_of(container)) - migrate.envs - AWS_CHAIN)
    need(not unknown, f"migrate-job.yaml: `outbox-relay migrate` reads no variable {', '.join(unknown)}")
    need((spec.get("securityContext") or {}).get("runAsUser") == IMAGE_UID,
         f"migrate-job.yaml: runAsUser must be the image's user {IMAGE_UID}")


def check_podmonitor(files):
    monitor = one(files[PODMONITOR], "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for name in (NATIVE, PLAIN):
        labels = one(files[name], "Deployment")["spec"]["template"]["metadata"]["labels"]
        need(all(labels.get(k) == v for k, v in selector.items()),
             f"podmonitor.yaml does not select the pods of {name}")
        where = "initContainers" if name == NATIVE else "containers"
        ports = {p.get("name") for p in relay_container(pod_spec(files[name]), where).get("ports") or []}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            need(endpoint["port"] in ports, f"podmonitor.yaml scrapes port {endpoint['port']!r}, which {name} does not declare")


def count(value, replicas, round_up):
    """A PodDisruptionBudget's or rolling update's int-or-percent field, in pods."""
    if isinstance(value, str) and value.endswith("%"):
        share = replicas * int(value[:-1]) / 100
        return int(-(-share // 1)) if round_up else int(share)
    need(isinstance(value, int), f"cannot read {value!r} as a number of pods or a percentage")
    return value


def check_rollout(files):
    """A new pod is up before an old one stops: the fleet never has fewer relays than replicas
    during an upgrade, and a new relay that cannot start stops the rollout at its first pod."""
    for name in (NATIVE, PLAIN):
        spec = one(files[name], "Deployment")["spec"]
        strategy = spec.get("strategy") or {}
        need(strategy.get("type") == "RollingUpdate",
             f"{name}: strategy {strategy.get('type')!r}, the upgrade needs RollingUpdate (docs/operations.md, Upgrading)")
        rolling = strategy.get("rollingUpdate") or {}
        replicas = spec.get("replicas", 1)
        # Unset, both default to 25 %: maxUnavailable then stops pods early from 4 replicas on.
        need("maxUnavailable" in rolling and count(rolling["maxUnavailable"], replicas, False) == 0,
             f"{name}: rollingUpdate.maxUnavailable must be 0, so an old pod stops only once a new one is ready")
        need(count(rolling.get("maxSurge", "25%"), replicas, True) >= 1,
             f"{name}: rollingUpdate.maxSurge must allow one new pod, or the rollout cannot start")


def check_pdb(files):
    """The budget covers the Deployment's pods and keeps one relay claiming through a drain."""
    budget = one(files[PDB], "PodDisruptionBudget")
    spec = budget["spec"]
    need("minAvailable" not in spec,
         f"{PDB}: minAvailable blocks every drain of a single replica; use maxUnavailable (see its comment)")
    need("maxUnavailable" in spec, f"{PDB}: no maxUnavailable")
    selector = spec["selector"]["matchLabels"]
    for name in (NATIVE, PLAIN):
        deployment = one(files[name], "Deployment")
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        need(all(labels.get(k) == v for k, v in selector.items()),
             f"{PDB} does not select the pods of {name}")
        for replicas in range(2, max(deployment["spec"].get("replicas", 1), 4) + 1):
            need(replicas - count(spec["maxUnavailable"], replicas, True) >= 1,
                 f"{PDB}: maxUnavailable {spec['maxUnavailable']!r} lets every one of {replicas} replicas be evicted at once")


def check_schema(files, name, version):
    for doc in files[name]:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise Failed(f"{name}: {doc['kind']} against Kubernetes {version}: {path}: {e.message}")


def kubectl_version(kubectl):
    out = subprocess.run([kubectl, "version", "--client", "-o", "yaml"],
                         capture_output=True, text=True, timeout=60)
    client = (yaml.safe_load(out.stdout) or {}).get("clientVersion") or {}
    major, minor = client.get("major", "0"), re.sub(r"\D.*", "", client.get("minor", "0"))
    return int(major), int(minor or 0)


def contains(inner, outer, path="$"):
    """Every field of `inner` is in `outer` with the same value (kubectl adds defaults)."""
    if isinstance(inner, dict):
        need(isinstance(outer, dict), f"{path}: became {outer!r}")
        for key, value in inner.items():
            need(key in outer, f"{path}.{key}: dropped by kubectl (unknown to its API types)")
            contains(value, outer[key], f"{path}.{key}")
    elif isinstance(inner, list):
        need(isinstance(outer, list) and len(outer) == len(inner), f"{path}: changed length")
        for i, (a, b) in enumerate(zip(inner, outer)):
            contains(a, b, f"{path}[{i}]")
    else:
        need(str(inner) == str(outer), f"{path}: {inner!r} became {outer!r}")


# kubectl prints nothing when `set env` changes nothing, so the round trip sets this variable
# in every container and takes it out again before comparing.
ROUNDTRIP_MARK = "OUTBOX_CHECK_ROUNDTRIP"


def check_kubectl(kubectl, files, name):
    """`kubectl set env --local` decodes into kubectl's typed API objects and prints them back,
    without a cluster; a field its types do not know is dropped, which `contains` catches."""
    workload = [d for d in files[name] if d["kind"] in ("Deployment", "Job")]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(workload, f)
        f.flush()
        out = subprocess.run(
            [kubectl, "set", "env", "--local", "-f", f.name, f"{ROUNDTRIP_MARK}=1", "-o", "yaml"],
            capture_output=True, text=True, timeout=60,
        )
    need(out.returncode == 0, f"{name}: kubectl: {out.stderr.strip()}")
    printed = [d for d in yaml.safe_load_all(out.stdout) if d]
    items = printed[0].get("items") if len(printed) == 1 and printed[0].get("kind") == "List" else printed
    need(len(items) == len(workload), f"{name}: kubectl printed {len(items)} objects for {len(workload)}")
    for before, after in zip(workload, items):
        spec = after["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec.get("containers", []):
            container["env"] = [e for e in container.get("env", []) if e["name"] != ROUNDTRIP_MARK]
            if not container["env"]:
                del container["env"]
        contains(before, after, f"{name}:{before['kind']}")


# --- running them ----------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.passed = self.failed = self.skipped = 0

    def run(self, title, check, *args):
        try:
            check(*args)
        except (Failed, LookupError, AttributeError, TypeError, ValueError) as e:
            self.failed += 1
            print(f"FAIL {title}: {type(e).__name__ + ': ' if not isinstance(e, Failed) else ''}{e}")
        else:
            self.passed += 1
            print(f"ok   {title}")

    def skip(self, title, why):
        self.skipped += 1
        print(f"skip {title}: {why}")


def suite(files, run, migrate):
    """The checks by title, each a function of the manifests."""
    return [
        ("manifests parse", check_parse),
        (f"{NATIVE}: the relay is a native sidecar", check_native_is_sidecar),
        (f"{PLAIN}: the relay is a regular container", check_plain_is_container),
        (f"{NATIVE}: probes, port, variables, user, grace period", lambda f: check_relay(f, NATIVE, "initContainers", run)),
        (f"{PLAIN}: probes, port, variables, user, grace period", lambda f: check_relay(f, PLAIN, "containers", run)),
        (f"{MIGRATE}: command, variables, user", lambda f: check_migrate(f, migrate)),
        (f"{PODMONITOR}: selects the pods, scrapes the relay's port", check_podmonitor),
        ("deployments: the rolling update starts a new pod before it stops an old one", check_rollout),
        (f"{PDB}: selects the pods, keeps one running through an eviction", check_pdb),
        (f"{NATIVE}: Kubernetes {NATIVE_SINCE} schema (strict)", lambda f: check_schema(f, NATIVE, NATIVE_SINCE)),
        (f"{PLAIN}: Kubernetes {OLDEST_SCHEMA} schema (strict)", lambda f: check_schema(f, PLAIN, OLDEST_SCHEMA)),
        (f"{MIGRATE}: Kubernetes {OLDEST_SCHEMA} schema (strict)", lambda f: check_schema(f, MIGRATE, OLDEST_SCHEMA)),
        (f"{PDB}: Kubernetes {OLDEST_SCHEMA} schema (strict)", lambda f: check_schema(f, PDB, OLDEST_SCHEMA)),
        (f"all: Kubernetes {kubernetes_validate.latest_version()} schema (strict)",
         lambda f: [check_schema(f, n, kubernetes_validate.latest_version()) for n in (NATIVE, PLAIN, MIGRATE, PDB)]),
    ]


def breakages():
    """Broken copies of the manifests, each with the check title fragment that must fail on it."""

    def relay(files, name=NATIVE, where="initContainers"):
        return relay_container(pod_spec(files[name]), where)

    def moved_to_containers(f):
        spec = pod_spec(f[NATIVE])
        spec["containers"].append(spec.pop("initContainers")[0])

    def env(f, name, value, where="initContainers", file=NATIVE):
        relay(f, file, where).setdefault("env", []).append({"name": name, "value": value})

    def set_env(f, name, value, file=NATIVE, where="initContainers"):
        for e in relay(f, file, where)["env"]:
            if e["name"] == name:
                e["value"] = value

    return [
        ("native sidecar", "restartPolicy removed", lambda f: relay(f).pop("restartPolicy")),
        ("native sidecar", "relay moved to containers", moved_to_containers),
        ("regular container", "restartPolicy on the plain container",
         lambda f: relay(f, PLAIN, "containers").update(restartPolicy="Always")),
        (f"{NATIVE}: probes", "liveness asks /readyz", lambda f: relay(f)["livenessProbe"]["httpGet"].update(path="/readyz")),
        (f"{NATIVE}: probes", "startup probe port 9899",
         lambda f: relay(f)["startupProbe"]["httpGet"].update(port=9899)),
        (f"{PLAIN}: probes", "relay listens elsewhere", lambda f: set_env(f, "OUTBOX_METRICS_ADDR", "0.0.0.0:9999", PLAIN, "containers")),
        (f"{NATIVE}: probes", "readiness probe added",
         lambda f: relay(f).update(readinessProbe={"httpGet": {"path": "/readyz", "port": "metrics"}})),
        (f"{NATIVE}: probes", "unknown variable", lambda f: env(f, "OUTBOX_DRAIN_TIMEOUTS", "30s")),
        (f"{NATIVE}: probes", "database URL inline", lambda f: set_env(f, "DATABASE_URL", "postgres://x") or
         [e.pop("valueFrom") for e in relay(f)["env"] if e["name"] == "DATABASE_URL"]),
        (f"{NATIVE}: probes", "grace period below drain + app",
         lambda f: pod_spec(f[NATIVE]).update(terminationGracePeriodSeconds=45)),
        (f"{PLAIN}: probes", "drain timeout above grace period",
         lambda f: set_env(f, "OUTBOX_DRAIN_TIMEOUT", "1m", PLAIN, "containers")),
        (f"{PLAIN}: probes", "root user", lambda f: pod_spec(f[PLAIN])["securityContext"].update(runAsUser=0)),
        (f"{MIGRATE}", "run-only variable in the Job",
         lambda f: pod_spec(f[MIGRATE])["containers"][0]["env"].append({"name": "OUTBOX_QUEUE_URL", "value": "x"})),
        (f"{PODMONITOR}", "scrapes a port nobody declares",
         lambda f: one(f[PODMONITOR], "PodMonitor")["spec"]["podMetricsEndpoints"][0].update(port="http-metrics")),
        ("rolling update", "strategy Recreate",
         lambda f: one(f[NATIVE], "Deployment")["spec"].update(strategy={"type": "Recreate"})),
        ("rolling update", "maxUnavailable left to its default",
         lambda f: one(f[PLAIN], "Deployment")["spec"]["strategy"]["rollingUpdate"].pop("maxUnavailable")),
        ("rolling update", "maxUnavailable 1",
         lambda f: one(f[NATIVE], "Deployment")["spec"]["strategy"]["rollingUpdate"].update(maxUnavailable=1)),
        (f"{PDB}", "budget selects other pods",
         lambda f: one(f[PDB], "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].update({"app.kubernetes.io/name": "other"})),
        (f"{PDB}", "minAvailable instead of maxUnavailable",
         lambda f: one(f[PDB], "PodDisruptionBudget")["spec"].update(minAvailable=1) or
         one(f[PDB], "PodDisruptionBudget")["spec"].pop("maxUnavailable")),
        (f"{PDB}", "every replica may go at once",
         lambda f: one(f[PDB], "PodDisruptionBudget")["spec"].update(maxUnavailable="100%")),
        (f"{PDB}: Kubernetes", "misspelt field",
         lambda f: one(f[PDB], "PodDisruptionBudget")["spec"].update(maxunavailable=1)),
        (f"{NATIVE}: Kubernetes", "misspelt field", lambda f: relay(f).update(restartpolicy="Always")),
        (f"{PLAIN}: Kubernetes", "native sidecar field on 1.25",
         lambda f: pod_spec(f[PLAIN]).update(initContainers=[dict(relay(f, PLAIN, "containers"), restartPolicy="Always")])),
    ]


def check_breakages(files, run, migrate, kubectl):
    """Each broken copy fails the check it targets, and the intact manifests pass them all."""
    checks = suite(files, run, migrate)
    problems = []
    for target, what, breaking in breakages():
        broken = copy.deepcopy(files)
        breaking(broken)
        caught = False
        for title, check in checks:
            if target not in title:
                continue
            try:
                check(broken)
            except Exception:
                # A check that breaks on a broken copy has failed it, which is what we want.
                caught = True
        if not caught:
            problems.append(what)
    if kubectl:
        broken = copy.deepcopy(files)
        relay_container(pod_spec(broken[NATIVE]), "initContainers")["restartpolicy"] = "Always"
        try:
            check_kubectl(kubectl, broken, NATIVE)
            problems.append("kubectl round trip kept a misspelt field")
        except Failed:
            pass
    need(not problems, "not caught: " + "; ".join(problems))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relay", required=True, help="the outbox-relay binary whose --help is the truth")
    args = parser.parse_args()

    report = Report()
    files = {}
    for path in sorted(MANIFESTS.glob("*.yaml")):
        try:
            files[path.name] = load(path)
        except yaml.YAMLError as e:
            report.run(f"{path.name} parses", fail, str(e))
    for name in (NATIVE, PLAIN, MIGRATE, PODMONITOR, PDB):
        if name not in files:
            report.run(f"{name} exists", fail, "missing or unparsable")
    if report.failed:
        print(f"kubernetes manifests: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
        return 1

    cmds = commands(args.relay)
    run, migrate = cmds["run"], cmds["migrate"]
    for title, check in suite(files, run, migrate):
        report.run(title, check, files)

    kubectl = shutil.which("kubectl")
    usable = None
    if kubectl is None:
        report.skip("kubectl round trip", "no kubectl installed (optional; the schema checks above cover the fields)")
    else:
        version = kubectl_version(kubectl)
        if version < (1, 29):
            report.skip("kubectl round trip",
                        f"kubectl {version[0]}.{version[1]} predates native sidecars (1.29): its types would drop restartPolicy")
        else:
            usable = kubectl
            for name in (NATIVE, PLAIN, MIGRATE):
                report.run(f"{name}: kubectl {version[0]}.{version[1]} round trip keeps every field",
                           check_kubectl, kubectl, files, name)

    report.run("every check fails on a broken copy", check_breakages, files, run, migrate, usable)
    print(f"kubernetes manifests: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
