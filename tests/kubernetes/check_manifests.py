"""Checks deploy/kubernetes/ (a Kustomize base, components and example overlays) against the
relay it deploys, without a cluster.

scripts/test runs it with the Python of .tools/kubernetes-venv (PyYAML, jsonschema and
kubernetes-validate, which ships the Kubernetes API's JSON schemas) and the binary it built:

    python tests/kubernetes/check_manifests.py --relay target/debug/outbox-relay

Every check prints one `ok`, `FAIL` or `skip` line; the last line counts them. The checks:

- every YAML file under deploy/kubernetes/ parses;
- the PrometheusRule (components/prometheusrule/prometheusrule.yaml, written by
  scripts/prometheusrule) holds exactly the groups of deploy/prometheus/alerts.yml, the one
  source of the rules;
- the relay's container is the same in the three layouts' sources (the native sidecar's patch,
  the plain sidecar's patch, the standalone Deployment) apart from restartPolicy;
- every overlay under overlays/ rendered with `kubectl kustomize` (a kubectl of 1.27 or newer,
  whose Kustomize is v5; otherwise a `skip` line says why), and on each rendered overlay:
  - every object names its apiVersion, kind and name; the overlay holds its layout's objects
    (the relay as a native sidecar, as a regular container beside the app, or as a Deployment
    running only the relay; the migrate Job, the PodMonitor, the PrometheusRule, the budget,
    and for the standalone layout the ScaledObject);
  - the relay: probes ask /healthz (the relay's semantics: loop alive) on the port the relay
    listens on (--metrics-addr, or its default when unset), no readiness probe (the documented
    choice), every environment variable (its own and its ConfigMap's) one of the command's own
    (from its `--help`) or the AWS chain's, the database URL from a Secret, the pod's name as
    its relay ID, the image's user (65532, deploy/Dockerfile) and non-root, and
    terminationGracePeriodSeconds above --drain-timeout (in the native layout with the app's
    shutdown allowance on top, since the app stops first);
  - the migrate Job runs `migrate` with `migrate`'s own variables, on the relays' table and
    wake-up mode; the PodMonitor selects the relays' pods, scrapes a port the relay declares
    and sets the job label the alerts select on; the Deployments roll out with RollingUpdate,
    maxUnavailable 0 and maxSurge at least 1; the PodDisruptionBudget selects the relays' pods
    and, with maxUnavailable (not minAvailable), leaves at least one running through an
    eviction; the PrometheusRule's groups are alerts.yml's;
  - the ScaledObject scales the standalone Deployment (which leaves `replicas` to it) from at
    least one replica, to a maximum whose connections (CONNECTIONS, per wake-up mode, times
    the maximum plus the rollout's surge) fit the budget it states; its scale-down cannot flap
    (a stabilization window of at least FLAP_WINDOW and of several refresh-scrape-poll
    cycles, policies of a minute or more); its query is the alerts' kind of query (max without
    (instance, pod) of a backlog gauge, job="outbox-relay") narrowed to its own namespace;
  - the Kubernetes API schemas (strict: unknown fields fail): the native layout against 1.29,
    the first version with native sidecars, the others against the oldest schema shipped; all
    against the newest; the custom resources (ScaledObject, PodMonitor, PrometheusRule)
    against the schemas in tests/kubernetes/schemas/ (README there);
  - where the kubectl is 1.29 or newer, a client-side round trip of the workloads through its
    API types (`kubectl set env --local`, which needs no cluster) keeps every field.
    `kubectl apply/create --dry-run=client` are not used: they need the API server's
    discovery even with --validate=false, so they fail without a cluster;
- deploy/README.md's rendered Deployment (the block after `<!-- rendered: ... -->`) is what
  `kubectl kustomize` makes of that overlay;
- the checks themselves: each one is fed a broken copy and must fail.
"""

import argparse
import copy
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
KUSTOMIZE = REPO / "deploy" / "kubernetes"
OVERLAYS = KUSTOMIZE / "overlays"
ALERTS = REPO / "deploy" / "prometheus" / "alerts.yml"
README = REPO / "deploy" / "README.md"
SCHEMAS = Path(__file__).resolve().parent / "schemas"
PROMETHEUSRULE = "components/prometheusrule/prometheusrule.yaml"
# Where each layout's relay container is written, and in which list of the pod.
RELAY_SOURCES = {
    "components/sidecar/relay.yaml": "initContainers",
    "components/sidecar-plain/relay.yaml": "containers",
    "components/standalone/deployment.yaml": "containers",
}
RELAY_CONTAINER = "outbox-relay"
# The example overlays, their layout, and what else each must hold.
LAYOUTS = {
    "sidecar": "native",
    "sidecar-plain": "plain",
    "standalone": "standalone",
}
EXPECTED_KINDS = {
    "native": ("ConfigMap", "Job", "PodMonitor", "PrometheusRule", "PodDisruptionBudget"),
    "plain": ("ConfigMap", "Job", "PodMonitor", "PrometheusRule", "PodDisruptionBudget"),
    "standalone": ("ConfigMap", "ServiceAccount", "Job", "PodMonitor", "PrometheusRule",
                   "PodDisruptionBudget", "ScaledObject"),
}
# deploy/Dockerfile: USER 65532:65532.
IMAGE_UID = 65532
# Native sidecars (initContainers[].restartPolicy) exist from this version on.
NATIVE_SINCE = "1.29.0"
# The schemas kubernetes-validate ships go back to here; plain containers are much older.
OLDEST_SCHEMA = "1.25.0"
# Kustomize v5 (components, patches with targets, replacements with options) is in kubectl
# from 1.27 on; Debian 12's kubernetes-client is 1.20.
KUSTOMIZE_SINCE = (1, 27)
# The app's own shutdown comes before the relay's drain in the native layout's grace period
# (overlays/sidecar/app.yaml says how much it allows for it).
APP_SHUTDOWN_ALLOWANCE = 20
# Database connections one relay holds, by --wakeup (docs/operations.md, "Autoscaling on the
# backlog", counts them in src/relay/): the claims' session, the settlements' session and the
# maintenance connection; with notify a LISTEN connection, with logical the replication connection
# that checks the publication before each (re)connection of its replication stream.
CONNECTIONS = {"poll": 3, "notify": 4, "logical": 4}
# The shortest scale-down stabilization window that keeps the relay count from flapping
# (components/keda/scaledobject.yaml says why).
FLAP_WINDOW = 300
# The job label the alerts, the dashboard and the KEDA query select on.
JOB = "outbox-relay"
BACKLOG_GAUGES = ("outbox_unsent_rows", "outbox_oldest_unsent_age_seconds")
# Custom resources and their schemas in tests/kubernetes/schemas/.
CUSTOM_SCHEMAS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.yaml",
    ("monitoring.coreos.com/v1", "PodMonitor"): "podmonitor.yaml",
    ("monitoring.coreos.com/v1", "PrometheusRule"): "prometheusrule.yaml",
}
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
    """A humantime or Prometheus duration in the forms the manifests use."""
    total = 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)", duration)
    need(parts and "".join(n + u for n, u in parts) == duration.replace(" ", ""),
         f"cannot read the duration {duration!r}")
    for number, unit in parts:
        total += float(number) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    return total


# --- reading manifests -----------------------------------------------------------------------


def load(text):
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def kinds(docs, kind):
    return [d for d in docs if d.get("kind") == kind]


def one(docs, kind, name=None):
    found = [d for d in kinds(docs, kind) if name is None or d["metadata"].get("name") == name]
    need(len(found) == 1, f"expected one {kind}{' ' + name if name else ''}, found {len(found)}")
    return found[0]


def pod_spec(workload):
    return workload["spec"]["template"]["spec"]


def relay_workloads(docs):
    """(Deployment, the list the relay is in) for every Deployment that runs the relay."""
    found = []
    for deployment in kinds(docs, "Deployment"):
        spec = pod_spec(deployment)
        for where in ("initContainers", "containers"):
            if any(c.get("name") == RELAY_CONTAINER for c in spec.get(where) or []):
                found.append((deployment, where))
    return found


def relay_container(spec, where):
    found = [c for c in spec.get(where) or [] if c.get("name") == RELAY_CONTAINER]
    need(len(found) == 1, f"expected the {RELAY_CONTAINER} container once in {where}")
    return found[0]


def the_relay(docs):
    """The overlay's one relay Deployment, the list the relay is in, and its container."""
    workloads = relay_workloads(docs)
    need(len(workloads) == 1, f"expected one Deployment running the relay, found {len(workloads)}")
    deployment, where = workloads[0]
    return deployment, where, relay_container(pod_spec(deployment), where)


def layout_of(deployment, where):
    spec = pod_spec(deployment)
    if where == "initContainers":
        return "native" if relay_container(spec, where).get("restartPolicy") == "Always" else "init"
    others = [c for c in spec.get("containers") or [] if c.get("name") != RELAY_CONTAINER]
    return "plain" if others else "standalone"


def config_value(docs, name, key):
    found = [d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"] == name]
    need(found, f"a container refers to the ConfigMap {name}, which the overlay does not make")
    data = found[0].get("data") or {}
    need(key in data, f"the ConfigMap {name} has no {key}")
    return data[key]


def env_of(container, docs):
    """Every variable the container gets, as Kubernetes resolves them: the keys of its envFrom
    ConfigMaps, then its env, which wins. The value, or None where it comes from a Secret or
    the pod."""
    out = {}
    for source in container.get("envFrom") or []:
        ref = source.get("configMapRef")
        need(ref, f"envFrom {source}: only ConfigMaps, whose keys can be checked")
        found = [d for d in kinds(docs, "ConfigMap") if d["metadata"]["name"] == ref["name"]]
        need(found, f"envFrom names the ConfigMap {ref['name']}, which the overlay does not make")
        for key, value in (found[0].get("data") or {}).items():
            out[source.get("prefix", "") + key] = value
    for entry in container.get("env") or []:
        ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
        if "value" in entry:
            out[entry["name"]] = entry["value"]
        elif ref:
            out[entry["name"]] = config_value(docs, ref["name"], ref["key"])
        else:
            out[entry["name"]] = None
    return out


def env_entry(container, name):
    found = [e for e in container.get("env") or [] if e["name"] == name]
    return found[0] if found else None


def listen_port(env, run):
    """The port the relay listens on: OUTBOX_METRICS_ADDR, else --metrics-addr's default."""
    addr = env.get("OUTBOX_METRICS_ADDR") or run.defaults["metrics-addr"]
    return int(addr.rsplit(":", 1)[1])


def setting(env, run, name, flag):
    return env.get(name) or run.defaults[flag]


def probe_port(container, probe):
    port = probe["httpGet"]["port"]
    if isinstance(port, int):
        return port
    named = [p for p in container.get("ports") or [] if p.get("name") == port]
    need(named, f"the probe's port {port!r} is not a named port of the container")
    return named[0]["containerPort"]


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


# --- checks on the sources (no kubectl needed) -----------------------------------------------


def check_sources_parse(world):
    need(world["sources"], "no YAML files under deploy/kubernetes/")
    for name, docs in world["sources"].items():
        need(docs, f"{name}: no YAML documents")
        for doc in docs:
            need(isinstance(doc, dict), f"{name}: a document is not a mapping")


def same_groups(groups, alerts, where):
    """A PrometheusRule's groups are alerts.yml's, field for field."""
    need(isinstance(groups, list), f"{where}: spec.groups is not a list")
    names = [g.get("name") for g in groups]
    need(names == [g["name"] for g in alerts],
         f"{where}: groups {names}, alerts.yml has {[g['name'] for g in alerts]} (run scripts/prometheusrule)")
    for ours, theirs in zip(groups, alerts):
        difference = first_difference(theirs, ours, f"groups[{theirs['name']}]")
        need(difference is None, f"{where} differs from alerts.yml at {difference} (run scripts/prometheusrule)")


def check_prometheusrule_source(world):
    rule = one(world["sources"][PROMETHEUSRULE], "PrometheusRule")
    same_groups(rule["spec"].get("groups"), world["alerts"], PROMETHEUSRULE)


def check_relay_sources(world):
    """The three layouts' relay containers are one container: a change to one (a probe, a
    limit, a variable) that the others do not get is caught here."""
    containers = {}
    for name, where in RELAY_SOURCES.items():
        docs = world["sources"][name]
        deployment = one(docs, "Deployment")
        container = copy.deepcopy(relay_container(pod_spec(deployment), where))
        container.pop("restartPolicy", None)
        containers[name] = container
        labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
        need(labels.get("outbox-relay/relay") == "true",
             f"{name}: the pod template lacks the label outbox-relay/relay: \"true\" that the PodMonitor and the budget select")
    (first, reference), *rest = containers.items()
    for name, container in rest:
        difference = first_difference(reference, container, RELAY_CONTAINER)
        need(difference is None, f"{name} and {first} differ at {difference}")


# --- checks on a rendered overlay ------------------------------------------------------------


def check_parse(docs, overlay):
    need(docs, "renders nothing")
    for doc in docs:
        need(isinstance(doc, dict), "a document is not a mapping")
        for key in ("apiVersion", "kind"):
            need(doc.get(key), f"a document has no {key}")
        need((doc.get("metadata") or {}).get("name"), f"a {doc['kind']} has no name")


def check_layout(docs, overlay):
    deployment, where, relay = the_relay(docs)
    layout = layout_of(deployment, where)
    expected = LAYOUTS.get(overlay)
    if expected:
        need(layout == expected, {
            "native": "the relay must be an init container with restartPolicy: Always (a native sidecar)",
            "plain": "the relay must be a regular container beside the app's",
            "standalone": "the relay must be the only container of a Deployment of its own",
        }[expected] + f", found layout {layout!r}")
    spec = pod_spec(deployment)
    if layout == "native":
        need(spec.get("containers"), "no application container")
        need(all(c.get("name") != RELAY_CONTAINER for c in spec.get("containers") or []),
             "the relay is also a regular container")
    else:
        need("restartPolicy" not in relay, "a regular container takes no restartPolicy")
    if layout == "standalone":
        need(not spec.get("initContainers"), "the standalone Deployment has init containers")
    for kind in EXPECTED_KINDS.get(expected or layout, ()):
        need(kinds(docs, kind), f"no {kind}: the example overlay shows every component of its layout")


def check_relay(docs, overlay, run):
    deployment, where, relay = the_relay(docs)
    spec = pod_spec(deployment)
    need((relay.get("args") or [None])[0] == "run", "the relay's args must start with run")
    env = env_of(relay, docs)

    port = listen_port(env, run)
    for kind in ("startupProbe", "livenessProbe"):
        probe = relay.get(kind)
        need(probe and "httpGet" in probe, f"the relay has no HTTP {kind}")
        need(probe["httpGet"].get("path") == "/healthz",
             f"{kind} asks {probe['httpGet'].get('path')}, the relay's liveness is /healthz")
        need(probe_port(relay, probe) == port,
             f"{kind} asks port {probe_port(relay, probe)}, the relay listens on {port}")
    need("readinessProbe" not in relay,
         "a readiness probe on the relay takes the app's pods out of their Service, or stalls rollouts and drains, while SQS or the database is down (see the manifest's note)")
    annotations = deployment["spec"]["template"]["metadata"].get("annotations") or {}
    if "prometheus.io/port" in annotations and layout_of(deployment, where) == "standalone":
        need(int(annotations["prometheus.io/port"]) == port,
             f"prometheus.io/port is {annotations['prometheus.io/port']}, the relay listens on {port}")
    need(any(p.get("name") == "metrics" and p.get("containerPort") == port for p in relay.get("ports") or []),
         f"no port named metrics at {port} (the PodMonitor scrapes it)")

    unknown = sorted(set(env) - run.envs - AWS_CHAIN)
    need(not unknown, f"`outbox-relay run` reads no variable {', '.join(unknown)}")
    database = env_entry(relay, "DATABASE_URL")
    need(database and "secretKeyRef" in (database.get("valueFrom") or {}) and env.get("DATABASE_URL") is None,
         "DATABASE_URL must come from a Secret, not a literal or a ConfigMap")
    relay_id = env_entry(relay, "OUTBOX_RELAY_ID")
    need(relay_id and ((relay_id.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") == "metadata.name",
         "OUTBOX_RELAY_ID must be the pod's name (fieldRef metadata.name): the default's process ID is 1 in every container")

    pod_context = spec.get("securityContext") or {}
    own_context = relay.get("securityContext") or {}
    user = own_context.get("runAsUser", pod_context.get("runAsUser"))
    need(user in (None, IMAGE_UID), f"the relay runs as user {user}, the image's user is {IMAGE_UID}")
    need(own_context.get("runAsNonRoot", pod_context.get("runAsNonRoot")) is True, "runAsNonRoot is not set for the relay")

    grace = spec.get("terminationGracePeriodSeconds", 30)
    drain = seconds(setting(env, run, "OUTBOX_DRAIN_TIMEOUT", "drain-timeout"))
    native = where == "initContainers"
    needed = drain + (APP_SHUTDOWN_ALLOWANCE if native else 0)
    need(grace > needed,
         f"terminationGracePeriodSeconds {grace} must exceed {needed:g}s (drain timeout {drain:g}s"
         + (f" after the app's {APP_SHUTDOWN_ALLOWANCE}s" if native else "") + ")")


def check_migrate(docs, overlay, run, migrate):
    job = one(docs, "Job")
    spec = pod_spec(job)
    container = [c for c in spec["containers"] if c.get("name") == "migrate"]
    need(container, "no container named migrate")
    container = container[0]
    need((container.get("args") or [None])[0] == "migrate", "the Job's args must start with migrate")
    env = env_of(container, docs)
    unknown = sorted(set(env) - migrate.envs - AWS_CHAIN)
    need(not unknown, f"`outbox-relay migrate` reads no variable {', '.join(unknown)}")
    database = env_entry(container, "DATABASE_URL")
    need(database and "secretKeyRef" in (database.get("valueFrom") or {}), "the Job's DATABASE_URL must come from a Secret")
    context = spec.get("securityContext") or {}
    need(context.get("runAsUser") == IMAGE_UID, f"the Job's runAsUser must be the image's user {IMAGE_UID}")
    _, _, relay = the_relay(docs)
    relay_env = env_of(relay, docs)
    for name, flag in (("OUTBOX_TABLE", "table"), ("OUTBOX_WAKEUP", "wakeup")):
        ours, theirs = setting(env, migrate, name, flag), setting(relay_env, run, name, flag)
        need(ours == theirs, f"the Job migrates with {name}={ours}, the relays run with {theirs}")


def check_podmonitor(docs, overlay):
    monitor = one(docs, "PodMonitor")
    deployment, where, relay = the_relay(docs)
    labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
    need(selects(monitor["spec"]["selector"], labels), "the PodMonitor does not select the relays' pods")
    need(monitor["metadata"].get("namespace") == deployment["metadata"].get("namespace")
         or monitor["spec"].get("namespaceSelector"), "the PodMonitor is not in the relays' namespace")
    ports = {p.get("name") for p in relay.get("ports") or []}
    endpoints = monitor["spec"].get("podMetricsEndpoints") or []
    need(endpoints, "the PodMonitor has no podMetricsEndpoints")
    for endpoint in endpoints:
        need(endpoint.get("port") in ports, f"the PodMonitor scrapes port {endpoint.get('port')!r}, which the relay does not declare")
        jobs = [r for r in endpoint.get("relabelings") or [] if r.get("targetLabel") == "job"]
        need(jobs and jobs[-1].get("replacement") == JOB,
             f"the PodMonitor must set job={JOB!r}, which the alerts, the dashboard and the KEDA query select on")


def count(value, replicas, round_up):
    """A PodDisruptionBudget's or rolling update's int-or-percent field, in pods."""
    if isinstance(value, str) and value.endswith("%"):
        share = replicas * int(value[:-1]) / 100
        return int(-(-share // 1)) if round_up else int(share)
    need(isinstance(value, int), f"cannot read {value!r} as a number of pods or a percentage")
    return value


def surge(deployment):
    rolling = (deployment["spec"].get("strategy") or {}).get("rollingUpdate") or {}
    return count(rolling.get("maxSurge", "25%"), deployment["spec"].get("replicas", 1), True)


def check_rollout(docs, overlay):
    """A new pod is up before an old one stops: the fleet never has fewer relays than replicas
    during an upgrade, and a new relay that cannot start stops the rollout at its first pod."""
    deployment, _, _ = the_relay(docs)
    spec = deployment["spec"]
    strategy = spec.get("strategy") or {}
    need(strategy.get("type") == "RollingUpdate",
         f"strategy {strategy.get('type')!r}, the upgrade needs RollingUpdate (docs/operations.md, Upgrading)")
    rolling = strategy.get("rollingUpdate") or {}
    replicas = spec.get("replicas", 1)
    # Unset, both default to 25 %: maxUnavailable then stops pods early from 4 replicas on.
    need("maxUnavailable" in rolling and count(rolling["maxUnavailable"], replicas, False) == 0,
         "rollingUpdate.maxUnavailable must be 0, so an old pod stops only once a new one is ready")
    need(surge(deployment) >= 1, "rollingUpdate.maxSurge must allow one new pod, or the rollout cannot start")


def check_pdb(docs, overlay):
    """The budget covers the relays' pods and keeps one relay claiming through a drain."""
    spec = one(docs, "PodDisruptionBudget")["spec"]
    need("minAvailable" not in spec,
         "minAvailable blocks every drain of a single replica; use maxUnavailable (see its comment)")
    need("maxUnavailable" in spec, "no maxUnavailable")
    deployment, _, _ = the_relay(docs)
    labels = deployment["spec"]["template"]["metadata"].get("labels") or {}
    need(selects(spec["selector"], labels), "the budget does not select the relays' pods")
    for replicas in range(2, max(deployment["spec"].get("replicas", 1), 4) + 1):
        need(replicas - count(spec["maxUnavailable"], replicas, True) >= 1,
             f"maxUnavailable {spec['maxUnavailable']!r} lets every one of {replicas} replicas be evicted at once")


def check_prometheusrule(docs, overlay, alerts):
    rule = one(docs, "PrometheusRule")
    same_groups(rule["spec"].get("groups"), alerts, "the PrometheusRule")


def query_selectors(query):
    """The label matchers of each metric selector in a PromQL expression, by metric name."""
    found = {}
    for metric, matchers in re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^}]*)\}", query):
        found.setdefault(metric, []).append(dict(re.findall(r'(\w+)\s*=\s*"([^"]*)"', matchers)))
    return found


def check_scaledobject(docs, overlay, run):
    scaled = one(docs, "ScaledObject")
    spec = scaled["spec"]
    target = spec["scaleTargetRef"]
    need(target.get("kind", "Deployment") == "Deployment", f"scales a {target.get('kind')}, not the relay's Deployment")
    deployments = [d for d in kinds(docs, "Deployment") if d["metadata"]["name"] == target["name"]]
    need(deployments, f"scaleTargetRef names {target['name']!r}, which the overlay does not make")
    deployment = deployments[0]
    need(any(d is deployment and layout_of(d, w) == "standalone" for d, w in relay_workloads(docs)),
         f"{target['name']} is not a Deployment running only the relay: scaling it would scale the application")
    need("replicas" not in deployment["spec"],
         f"{target['name']} still sets replicas, which every apply would reset under the autoscaler")

    low, high = spec.get("minReplicaCount", 0), spec.get("maxReplicaCount", 100)
    need(low >= 1, f"minReplicaCount {low}: at zero relays nothing reports the backlog to scale up on")
    need(high >= low, f"maxReplicaCount {high} below minReplicaCount {low}")
    budget = (scaled["metadata"].get("annotations") or {}).get("outbox-relay/connection-budget")
    need(budget is not None and budget.isdigit(),
         "no outbox-relay/connection-budget annotation: the maximum must be reckoned from the database's connection budget")
    _, _, relay = the_relay(docs)
    wakeup = setting(env_of(relay, docs), run, "OUTBOX_WAKEUP", "wakeup")
    need(wakeup in CONNECTIONS, f"no connection count for --wakeup {wakeup}")
    peak = (high + surge(deployment)) * CONNECTIONS[wakeup]
    need(peak <= int(budget),
         f"maxReplicaCount {high} plus the rollout's surge {surge(deployment)} at {CONNECTIONS[wakeup]} connections each "
         f"(--wakeup {wakeup}) is {peak}, above the budget of {budget}")

    behavior = ((spec.get("advanced") or {}).get("horizontalPodAutoscalerConfig") or {}).get("behavior") or {}
    down, up = behavior.get("scaleDown") or {}, behavior.get("scaleUp") or {}
    monitor = one(docs, "PodMonitor")
    scrape = max(seconds(e.get("interval", "1m")) for e in monitor["spec"]["podMetricsEndpoints"])
    cycle = seconds(setting(env_of(relay, docs), run, "OUTBOX_STATS_INTERVAL", "stats-interval")) + scrape + spec.get("pollingInterval", 30)
    window = down.get("stabilizationWindowSeconds")
    need(window is not None and window >= max(FLAP_WINDOW, 4 * cycle),
         f"scaleDown.stabilizationWindowSeconds {window}: at least {max(FLAP_WINDOW, 4 * cycle):g}s "
         f"(and four refresh + scrape + poll cycles of {cycle:g}s), or one quiet reading removes relays")
    policies = down.get("policies") or []
    need(policies, "scaleDown has no policies: the autoscaler's default removes every surplus relay at once")
    for policy in policies:
        need(policy.get("periodSeconds", 0) >= 60, f"scaleDown policy {policy}: a period under a minute")
    need(up.get("stabilizationWindowSeconds", 0) < window, "scaleUp waits longer than scaleDown")

    triggers = spec.get("triggers") or []
    need(triggers, "no triggers")
    namespace = scaled["metadata"].get("namespace")
    for trigger in triggers:
        need(trigger.get("type") == "prometheus", f"trigger {trigger.get('type')}: the relay's backlog is in Prometheus")
        query = trigger["metadata"].get("query", "")
        need(re.match(r"^\s*max without \(instance, pod\) \(", query),
             f"query {query!r}: the table gauges are taken as max without (instance, pod), as the alerts do")
        selectors = query_selectors(query)
        gauges = [m for m in selectors if m in BACKLOG_GAUGES]
        need(gauges, f"query {query!r} reads none of {', '.join(BACKLOG_GAUGES)}")
        for metric in selectors:
            for matchers in selectors[metric]:
                need(matchers.get("job") == JOB, f"query {query!r}: {metric} must select job=\"{JOB}\"")
                need(matchers.get("namespace") == namespace,
                     f"query {query!r}: {metric} must select the relays' namespace {namespace!r} (KEDA needs one series)")
        need(float(trigger["metadata"].get("threshold", "0")) > 0, "no threshold above 0")


def check_schema(docs, overlay, version):
    for doc in docs:
        if (doc.get("apiVersion"), doc.get("kind")) in CUSTOM_SCHEMAS:
            continue
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            path = ".".join(str(p) for p in e.path)
            raise Failed(f"{doc['kind']} {doc['metadata']['name']} against Kubernetes {version}: {path}: {e.message}")
        except kubernetes_validate.utils.SchemaNotFoundError:
            fail(f"no schema for {doc['apiVersion']} {doc['kind']}: a custom resource needs one in tests/kubernetes/schemas/")


def custom_validators():
    schemas = {p.name: yaml.safe_load(p.read_text()) for p in SCHEMAS.glob("*.yaml")}
    registry = Registry().with_resources(
        (name, Resource.from_contents(schema)) for name, schema in schemas.items()
    )
    return {
        key: jsonschema.Draft202012Validator(schemas[name], registry=registry)
        for key, name in CUSTOM_SCHEMAS.items()
    }


def check_custom_schemas(docs, overlay, validators):
    for doc in docs:
        validator = validators.get((doc.get("apiVersion"), doc.get("kind")))
        if validator is None:
            continue
        errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path))
        if errors:
            error = errors[0]
            path = ".".join(str(p) for p in error.absolute_path)
            fail(f"{doc['kind']} {doc['metadata']['name']}: {path}: {error.message}")


def first_difference(a, b, path="$"):
    """Where two parsed YAML values first differ, or None."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                return f"{path}.{key} ({'missing' if key not in b else 'extra'})"
            found = first_difference(a[key], b[key], f"{path}.{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path} ({len(a)} items, {len(b)} items)"
        for i, (x, y) in enumerate(zip(a, b)):
            found = first_difference(x, y, f"{path}[{i}]")
            if found:
                return found
        return None
    return None if a == b and type(a) is type(b) else f"{path} ({a!r}, {b!r})"


def readme_blocks(text):
    """(overlay, kind, name, parsed block) for each ```yaml block after a rendered marker."""
    pattern = r"<!-- rendered: overlays/([\w-]+) (\w+)/([\w-]+) -->\s*```yaml\n(.*?)```"
    return [(o, k, n, yaml.safe_load(body)) for o, k, n, body in re.findall(pattern, text, re.S)]


def check_readme(world):
    blocks = readme_blocks(world["readme"])
    need(blocks, "deploy/README.md shows no rendered object (<!-- rendered: overlays/NAME Kind/name --> before a yaml block)")
    for overlay, kind, name, shown in blocks:
        need(overlay in world["renders"], f"deploy/README.md shows overlays/{overlay}, which does not exist")
        rendered = one(world["renders"][overlay], kind, name)
        difference = first_difference(rendered, shown, f"{kind}/{name}")
        need(difference is None,
             f"deploy/README.md's {kind}/{name} is not what `kubectl kustomize deploy/kubernetes/overlays/{overlay}` "
             f"makes of it (rendered, shown: {difference}); paste the render again")


# --- kubectl ---------------------------------------------------------------------------------


def kubectl_version(kubectl):
    out = subprocess.run([kubectl, "version", "--client", "-o", "yaml"],
                         capture_output=True, text=True, timeout=60)
    client = (yaml.safe_load(out.stdout) or {}).get("clientVersion") or {}
    major, minor = client.get("major", "0"), re.sub(r"\D.*", "", client.get("minor", "0"))
    return int(major), int(minor or 0)


def render(kubectl, overlay_dir):
    out = subprocess.run([kubectl, "kustomize", str(overlay_dir)], capture_output=True, text=True, timeout=120)
    need(out.returncode == 0, f"kubectl kustomize: {out.stderr.strip()}")
    return load(out.stdout)


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


def check_kubectl(docs, overlay, kubectl):
    """`kubectl set env --local` decodes into kubectl's typed API objects and prints them back,
    without a cluster; a field its types do not know is dropped, which `contains` catches."""
    workload = [d for d in docs if d["kind"] in ("Deployment", "Job")]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(workload, f)
        f.flush()
        out = subprocess.run(
            [kubectl, "set", "env", "--local", "-f", f.name, f"{ROUNDTRIP_MARK}=1", "-o", "yaml"],
            capture_output=True, text=True, timeout=60,
        )
    need(out.returncode == 0, f"kubectl: {out.stderr.strip()}")
    printed = [d for d in yaml.safe_load_all(out.stdout) if d]
    items = printed[0].get("items") if len(printed) == 1 and printed[0].get("kind") == "List" else printed
    need(len(items) == len(workload), f"kubectl printed {len(items)} objects for {len(workload)}")
    for before, after in zip(workload, items):
        spec = after["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec.get("containers", []):
            container["env"] = [e for e in container.get("env", []) if e["name"] != ROUNDTRIP_MARK]
            if not container["env"]:
                del container["env"]
        contains(before, after, f"{before['kind']}/{before['metadata']['name']}")


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


def suite(world, run, migrate, validators, kubectl):
    """The checks by title, each a function of the world (sources, renders, alerts, README)."""
    checks = [
        ("deploy/kubernetes: every YAML file parses", check_sources_parse),
        (f"{PROMETHEUSRULE}: its groups are deploy/prometheus/alerts.yml's", check_prometheusrule_source),
        ("the relay's container is the same in every layout", check_relay_sources),
    ]
    latest = kubernetes_validate.latest_version()

    def per(check, *extra):
        return lambda overlay: lambda w: check(w["renders"][overlay], overlay, *extra)

    for overlay in sorted(world["renders"]):
        oldest = NATIVE_SINCE if LAYOUTS.get(overlay) == "native" else OLDEST_SCHEMA
        prefix = f"overlays/{overlay}:"
        checks += [
            (f"{prefix} objects named", per(check_parse)(overlay)),
            (f"{prefix} the relay's layout and the components it shows", per(check_layout)(overlay)),
            (f"{prefix} probes, port, variables, relay ID, user, grace period", per(check_relay, run)(overlay)),
            (f"{prefix} migrate Job: command, variables, user, the relays' table and wake-up", per(check_migrate, run, migrate)(overlay)),
            (f"{prefix} PodMonitor selects the relays, scrapes their port, sets the job", per(check_podmonitor)(overlay)),
            (f"{prefix} rolling update starts a new pod before it stops an old one", per(check_rollout)(overlay)),
            (f"{prefix} PodDisruptionBudget selects the relays, keeps one running through an eviction", per(check_pdb)(overlay)),
            (f"{prefix} PrometheusRule groups are alerts.yml's", per(check_prometheusrule, world["alerts"])(overlay)),
            (f"{prefix} Kubernetes {oldest} schema (strict)", per(check_schema, oldest)(overlay)),
            (f"{prefix} Kubernetes {latest} schema (strict)", per(check_schema, latest)(overlay)),
            (f"{prefix} custom resource schemas (strict)", per(check_custom_schemas, validators)(overlay)),
        ]
        if kinds(world["renders"][overlay], "ScaledObject") or LAYOUTS.get(overlay) == "standalone":
            checks.append((f"{prefix} ScaledObject: target, replicas, connection budget, scale-down, query",
                           per(check_scaledobject, run)(overlay)))
        if kubectl:
            checks.append((f"{prefix} kubectl round trip keeps every field", per(check_kubectl, kubectl)(overlay)))
    if world["renders"]:
        checks.append(("deploy/README.md: the rendered Deployment is the overlay's", check_readme))
    return checks


def breakages():
    """Broken copies, each with the check title fragment that must fail on it."""

    def docs(w, overlay):
        return w["renders"][overlay]

    def relay(w, overlay):
        return the_relay(docs(w, overlay))[2]

    def pod(w, overlay):
        return pod_spec(the_relay(docs(w, overlay))[0])

    def obj(w, overlay, kind):
        return one(docs(w, overlay), kind)

    def set_env(w, overlay, name, value):
        for e in relay(w, overlay)["env"]:
            if e["name"] == name:
                e.pop("valueFrom", None)
                e["value"] = value

    def drop_env(w, overlay, name):
        relay(w, overlay)["env"] = [e for e in relay(w, overlay)["env"] if e["name"] != name]

    def moved_to_containers(w):
        spec = pod(w, "sidecar")
        spec["containers"].append(spec.pop("initContainers")[0])

    def config(w, overlay):
        return obj(w, overlay, "ConfigMap")["data"]

    def listens_elsewhere_by_configmap(w):
        drop_env(w, "standalone", "OUTBOX_METRICS_ADDR")
        config(w, "standalone")["OUTBOX_METRICS_ADDR"] = "0.0.0.0:9999"

    def job_env(w, overlay):
        return pod_spec(obj(w, overlay, "Job"))["containers"][0]["env"]

    def table_literal(w):
        for e in job_env(w, "sidecar"):
            if e["name"] == "OUTBOX_TABLE":
                e.pop("valueFrom")
                e["value"] = "app.outbox"

    def scaled(w):
        return obj(w, "standalone", "ScaledObject")

    def scale_down(w):
        return scaled(w)["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"]

    def trigger(w):
        return scaled(w)["spec"]["triggers"][0]["metadata"]

    def rule(w, overlay):
        return obj(w, overlay, "PrometheusRule")["spec"]["groups"][0]["rules"]

    def source_relay(w, name):
        where = RELAY_SOURCES[name]
        return relay_container(pod_spec(one(w["sources"][name], "Deployment")), where)

    def readme_differs(w):
        one(docs(w, "sidecar"), "Deployment")["spec"]["replicas"] = 3

    sources = [
        ("alerts.yml's", "PrometheusRule source drifted from alerts.yml",
         lambda w: one(w["sources"][PROMETHEUSRULE], "PrometheusRule")["spec"]["groups"][0]["rules"][0].update({"for": "1m"})),
        ("alerts.yml's", "a rule missing from the PrometheusRule source",
         lambda w: one(w["sources"][PROMETHEUSRULE], "PrometheusRule")["spec"]["groups"][0]["rules"].pop()),
        ("same in every layout", "one layout's relay gets a higher memory limit",
         lambda w: source_relay(w, "components/standalone/deployment.yaml")["resources"]["limits"].update(memory="512Mi")),
        ("same in every layout", "one layout's relay loses its pod label",
         lambda w: one(w["sources"]["components/sidecar-plain/relay.yaml"], "Deployment")["spec"]["template"]["metadata"]["labels"].clear()),
    ]
    renders = [
        ("overlays/sidecar: the relay's layout", "restartPolicy removed", lambda w: relay(w, "sidecar").pop("restartPolicy")),
        ("overlays/sidecar: the relay's layout", "relay moved to containers", moved_to_containers),
        ("overlays/sidecar-plain: the relay's layout", "restartPolicy on the plain container",
         lambda w: relay(w, "sidecar-plain").update(restartPolicy="Always")),
        ("overlays/standalone: the relay's layout", "an app container beside the standalone relay",
         lambda w: pod(w, "standalone")["containers"].append({"name": "app", "image": "x"})),
        ("overlays/sidecar: the relay's layout", "the overlay lost its budget",
         lambda w: docs(w, "sidecar").remove(obj(w, "sidecar", "PodDisruptionBudget"))),
        ("overlays/sidecar: probes", "liveness asks /readyz",
         lambda w: relay(w, "sidecar")["livenessProbe"]["httpGet"].update(path="/readyz")),
        ("overlays/sidecar: probes", "startup probe port 9899",
         lambda w: relay(w, "sidecar")["startupProbe"]["httpGet"].update(port=9899)),
        ("overlays/sidecar-plain: probes", "relay listens elsewhere",
         lambda w: set_env(w, "sidecar-plain", "OUTBOX_METRICS_ADDR", "0.0.0.0:9999")),
        ("overlays/standalone: probes", "relay listens elsewhere, set in the ConfigMap", listens_elsewhere_by_configmap),
        ("overlays/sidecar: probes", "readiness probe added",
         lambda w: relay(w, "sidecar").update(readinessProbe={"httpGet": {"path": "/readyz", "port": "metrics"}})),
        ("overlays/sidecar: probes", "unknown variable",
         lambda w: relay(w, "sidecar")["env"].append({"name": "OUTBOX_DRAIN_TIMEOUTS", "value": "30s"})),
        ("overlays/standalone: probes", "unknown variable in the ConfigMap",
         lambda w: config(w, "standalone").update(OUTBOX_QUEUE_URLS="x")),
        ("overlays/sidecar: probes", "database URL inline", lambda w: set_env(w, "sidecar", "DATABASE_URL", "postgres://x")),
        ("overlays/standalone: probes", "relay ID left to its default", lambda w: drop_env(w, "standalone", "OUTBOX_RELAY_ID")),
        ("overlays/sidecar: probes", "grace period below drain + app",
         lambda w: pod(w, "sidecar").update(terminationGracePeriodSeconds=45)),
        ("overlays/sidecar-plain: probes", "drain timeout above grace period",
         lambda w: set_env(w, "sidecar-plain", "OUTBOX_DRAIN_TIMEOUT", "1m")),
        ("overlays/standalone: probes", "root user", lambda w: relay(w, "standalone")["securityContext"].update(runAsUser=0)),
        ("overlays/sidecar: probes", "runAsNonRoot dropped",
         lambda w: relay(w, "sidecar")["securityContext"].pop("runAsNonRoot") and pod(w, "sidecar")["securityContext"].pop("runAsNonRoot")),
        ("overlays/sidecar: migrate", "run-only variable in the Job",
         lambda w: job_env(w, "sidecar").append({"name": "OUTBOX_QUEUE_URL", "value": "x"})),
        ("overlays/sidecar: migrate", "the Job migrates another table", table_literal),
        ("overlays/standalone: migrate", "the relays use another wake-up than the Job sets up",
         lambda w: relay(w, "standalone")["env"].append({"name": "OUTBOX_WAKEUP", "value": "notify"})),
        ("overlays/sidecar: PodMonitor", "scrapes a port nobody declares",
         lambda w: obj(w, "sidecar", "PodMonitor")["spec"]["podMetricsEndpoints"][0].update(port="http-metrics")),
        ("overlays/standalone: PodMonitor", "selects other pods",
         lambda w: obj(w, "standalone", "PodMonitor")["spec"]["selector"]["matchLabels"].update({"outbox-relay/relay": "no"})),
        ("overlays/sidecar: PodMonitor", "job label left to the operator's default",
         lambda w: obj(w, "sidecar", "PodMonitor")["spec"]["podMetricsEndpoints"][0].pop("relabelings")),
        ("overlays/sidecar: rolling update", "strategy Recreate",
         lambda w: one(docs(w, "sidecar"), "Deployment")["spec"].update(strategy={"type": "Recreate"})),
        ("overlays/sidecar-plain: rolling update", "maxUnavailable left to its default",
         lambda w: one(docs(w, "sidecar-plain"), "Deployment")["spec"]["strategy"]["rollingUpdate"].pop("maxUnavailable")),
        ("overlays/standalone: rolling update", "maxUnavailable 1",
         lambda w: one(docs(w, "standalone"), "Deployment")["spec"]["strategy"]["rollingUpdate"].update(maxUnavailable=1)),
        ("overlays/sidecar: PodDisruptionBudget", "budget selects other pods",
         lambda w: obj(w, "sidecar", "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].update({"outbox-relay/relay": "no"})),
        ("overlays/standalone: PodDisruptionBudget", "minAvailable instead of maxUnavailable",
         lambda w: obj(w, "standalone", "PodDisruptionBudget")["spec"].update(minAvailable=1) or
         obj(w, "standalone", "PodDisruptionBudget")["spec"].pop("maxUnavailable")),
        ("overlays/sidecar: PodDisruptionBudget", "every replica may go at once",
         lambda w: obj(w, "sidecar", "PodDisruptionBudget")["spec"].update(maxUnavailable="100%")),
        ("overlays/standalone: PrometheusRule", "a rule changed in the render",
         lambda w: rule(w, "standalone")[0].update(expr="vector(1)")),
        ("overlays/sidecar: Kubernetes 1.29", "misspelt field", lambda w: relay(w, "sidecar").update(restartpolicy="Always")),
        ("overlays/standalone: Kubernetes 1.25", "misspelt budget field",
         lambda w: obj(w, "standalone", "PodDisruptionBudget")["spec"].update(maxunavailable=1)),
        ("overlays/sidecar-plain: Kubernetes 1.25", "native sidecar field on 1.25",
         lambda w: pod(w, "sidecar-plain").update(initContainers=[dict(relay(w, "sidecar-plain"), name="x", restartPolicy="Always")])),
        ("overlays/sidecar: custom resource", "misspelt PodMonitor field",
         lambda w: obj(w, "sidecar", "PodMonitor")["spec"].update(podMetricEndpoints=[])),
        ("overlays/standalone: custom resource", "threshold not a string",
         lambda w: trigger(w).update(threshold=5000)),
        ("overlays/standalone: custom resource", "misspelt scaler parameter",
         lambda w: trigger(w).update(treshold="5000")),
        ("overlays/standalone: custom resource", "scale-down policy of an unknown type",
         lambda w: scale_down(w)["policies"][0].update(type="Replicas")),
        ("overlays/sidecar-plain: custom resource", "a rule with expression instead of expr",
         lambda w: rule(w, "sidecar-plain")[0].update(expression=rule(w, "sidecar-plain")[0].pop("expr"))),
        ("overlays/standalone: ScaledObject", "scales to zero", lambda w: scaled(w)["spec"].update(minReplicaCount=0)),
        ("overlays/standalone: ScaledObject", "maximum beyond the connection budget",
         lambda w: scaled(w)["spec"].update(maxReplicaCount=10)),
        ("overlays/standalone: ScaledObject", "budget too small for logical wake-ups",
         lambda w: config(w, "standalone").update(OUTBOX_WAKEUP="logical") or
         scaled(w)["metadata"]["annotations"].update({"outbox-relay/connection-budget": "20"})),
        ("overlays/standalone: ScaledObject", "no budget stated",
         lambda w: scaled(w)["metadata"].pop("annotations")),
        ("overlays/standalone: ScaledObject", "scale-down window of a minute",
         lambda w: scale_down(w).update(stabilizationWindowSeconds=60)),
        ("overlays/standalone: ScaledObject", "scale-down every 15 seconds",
         lambda w: scale_down(w)["policies"][0].update(periodSeconds=15)),
        ("overlays/standalone: ScaledObject", "scales a Deployment the overlay does not make",
         lambda w: scaled(w)["spec"]["scaleTargetRef"].update(name="orders")),
        ("overlays/standalone: ScaledObject", "the Deployment keeps replicas",
         lambda w: one(docs(w, "standalone"), "Deployment")["spec"].update(replicas=2)),
        ("overlays/standalone: ScaledObject", "query for another namespace",
         lambda w: trigger(w).update(query=trigger(w)["query"].replace('namespace="orders"', 'namespace="NAMESPACE"'))),
        ("overlays/standalone: ScaledObject", "query summing over replicas",
         lambda w: trigger(w).update(query=trigger(w)["query"].replace("max without (instance, pod)", "sum"))),
        ("deploy/README.md", "the render differs from what the README shows", readme_differs),
    ]
    return sources, renders


def check_breakages(world, run, migrate, validators, kubectl):
    """Each broken copy fails the check it targets, and the intact manifests pass them all."""
    sources, renders = breakages()
    cases = sources + (renders if world["renders"] else [])
    problems = []
    for target, what, breaking in cases:
        broken = copy.deepcopy(world)
        breaking(broken)
        caught = False
        for title, check in suite(broken, run, migrate, validators, None):
            if target not in title:
                continue
            try:
                check(broken)
            except Exception:
                # A check that breaks on a broken copy has failed it, which is what we want.
                caught = True
        if not caught:
            problems.append(what)
    if kubectl and world["renders"]:
        broken = copy.deepcopy(world)
        relay_container(pod_spec(one(broken["renders"]["sidecar"], "Deployment")), "initContainers")["restartpolicy"] = "Always"
        try:
            check_kubectl(broken["renders"]["sidecar"], "sidecar", kubectl)
            problems.append("kubectl round trip kept a misspelt field")
        except Failed:
            pass
    need(not problems, "not caught: " + "; ".join(problems))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--relay", required=True, help="the outbox-relay binary whose --help is the truth")
    args = parser.parse_args()

    report = Report()
    world = {"sources": {}, "renders": {}, "alerts": None, "readme": README.read_text()}
    for path in sorted(KUSTOMIZE.rglob("*.yaml")):
        name = str(path.relative_to(KUSTOMIZE))
        try:
            world["sources"][name] = load(path.read_text())
        except yaml.YAMLError as e:
            report.run(f"{name} parses", fail, str(e))
    for name in [PROMETHEUSRULE, *RELAY_SOURCES]:
        if name not in world["sources"]:
            report.run(f"{name} exists", fail, "missing or unparsable")
    world["alerts"] = yaml.safe_load(ALERTS.read_text())["groups"]
    if report.failed:
        print(f"kubernetes manifests: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
        return 1

    cmds = commands(args.relay)
    run, migrate = cmds["run"], cmds["migrate"]
    validators = custom_validators()

    kubectl = shutil.which("kubectl")
    roundtrip = None
    overlays = sorted(p.parent for p in OVERLAYS.glob("*/kustomization.yaml"))
    if kubectl is None:
        report.skip("overlays: kubectl kustomize",
                    f"no kubectl installed; the {len(overlays)} overlays' checks need its Kustomize (kubectl {KUSTOMIZE_SINCE[0]}.{KUSTOMIZE_SINCE[1]} or newer)")
    else:
        version = kubectl_version(kubectl)
        if version < KUSTOMIZE_SINCE:
            report.skip("overlays: kubectl kustomize",
                        f"kubectl {version[0]}.{version[1]}'s Kustomize predates components (kubectl {KUSTOMIZE_SINCE[0]}.{KUSTOMIZE_SINCE[1]} or newer, Kustomize v5)")
        else:
            for overlay in overlays:
                title = f"overlays/{overlay.name}: kubectl {version[0]}.{version[1]} kustomize renders"
                try:
                    world["renders"][overlay.name] = render(kubectl, overlay)
                    report.run(title, lambda: None)
                except Failed as e:
                    report.run(title, fail, str(e))
            if version < (1, 29):
                report.skip("kubectl round trip",
                            f"kubectl {version[0]}.{version[1]} predates native sidecars (1.29): its types would drop restartPolicy")
            else:
                roundtrip = kubectl
    missing = sorted(set(LAYOUTS) - set(world["renders"]))
    if world["renders"] and missing:
        report.run("the example overlays render", fail, f"missing: {', '.join(missing)}")
        world["renders"] = {}

    for title, check in suite(world, run, migrate, validators, roundtrip):
        report.run(title, check, world)
    if not world["renders"]:
        report.skip("deploy/README.md: the rendered Deployment is the overlay's", "no overlay rendered (above)")

    report.run("every check fails on a broken copy", check_breakages, world, run, migrate, validators, roundtrip)
    print(f"kubernetes manifests: {report.passed} passed, {report.failed} failed, {report.skipped} skipped")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
