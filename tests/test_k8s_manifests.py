"""The Kubernetes manifests: every kustomization under deploy/k8s (the single-broker base and each
overlay) renders (and the real kustomize builds the same objects), every object it yields is valid
against the Kubernetes API schemas of KUBERNETES_VERSION (kubernetes-validate, strict: unknown fields
are errors), every container is probed and declares exactly the ports its flags serve; each group's
broker pod runs `serve broker` alone, its front gateways' Deployment reaches it through its headless
Service on ports it declares, its client Service selects both kinds of pods, and its internal ports
(owner, CommitLog, ha) are open to its front pods only (and, in the master/slave overlay, the master's
ha port to the slave). In the cluster overlay, etcd's three members name each other consistently,
every broker points at etcd's client Service with a brokerName and a claim of its own, and etcd's
client port is open to the broker pods only, its peer port to the etcd pods only."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kustomize_render import RenderError, render

KUBERNETES_VERSION = "1.30.0"
K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUSTOMIZATIONS = [K8S, *sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))]
NAMESPACE = "rocketstore"
BROKER, FRONTS, SLAVE = "rocketstore-broker", "rocketstore-gateway", "rocketstore-broker-slave"
CLIENT_SERVICE = "rocketstore-gateway"
# Each broker group's (master) StatefulSet -> its front gateways' Deployment and its client Service.
GROUPS = {BROKER: (FRONTS, CLIENT_SERVICE),
          "rocketstore-broker-b": ("rocketstore-gateway-b", "rocketstore-gateway-b")}
CLUSTER = K8S / "overlays" / "cluster"
ETCD, ETCD_CLIENT_SERVICE, CLUSTER_SERVICE = "rocketstore-etcd", "rocketstore-etcd", "rocketstore-cluster"
# Official etcd images: what makes a workload an etcd one, checked as etcd rather than as `rocketstore serve`.
ETCD_IMAGES = ("registry.k8s.io/etcd:3.5.", "quay.io/coreos/etcd:v3.5.")
# The flags naming a port each process listens on.
PORT_FLAGS = ("--port", "--metrics-port", "--own-port", "--internal-port", "--ha-port")
# A front gateway's endpoint flag -> the broker's flag of the port it must name.
FRONT_PEERS = {"--owner": "--own-port", "--commitlog": "--internal-port", "--ha": "--ha-port"}
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def _name(path: Path) -> str:
    return str(path.relative_to(K8S.parent)) if path != K8S else "deploy/k8s"


def _workloads(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] in ("StatefulSet", "Deployment")}


def _object(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"{len(found)} {kind}/{name}"
    return found[0]


def _labels(workload: dict[str, Any]) -> dict[str, str]:
    return dict(workload["spec"]["template"]["metadata"]["labels"])


def _only(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, f"{workload['metadata']['name']}: one process per pod, not {len(containers)}"
    return dict(containers[0])


def _flag(container: dict[str, Any], flag: str) -> str | None:
    cmd = container["command"]
    assert cmd.count(flag) <= 1, f"{container['name']}: {flag} given twice"
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _selects(selector: dict[str, str], workload: dict[str, Any]) -> bool:
    return bool(selector) and selector.items() <= _labels(workload).items()


def _container_port(workload: dict[str, Any], target: int | str) -> int | None:
    """The container port a Service's targetPort (a number or a port name) resolves to in ``workload``."""
    for c in workload["spec"]["template"]["spec"]["containers"]:
        for p in c.get("ports", []):
            if target in (p["containerPort"], p.get("name")):
                return int(p["containerPort"])
    return None


def _is_etcd(workload: dict[str, Any]) -> bool:
    return any(c["image"].startswith(ETCD_IMAGES) for c in workload["spec"]["template"]["spec"]["containers"])


def _brokers(workloads: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every broker StatefulSet (every StatefulSet but etcd's)."""
    return {n: w for n, w in workloads.items() if w["kind"] == "StatefulSet" and not _is_etcd(w)}


def _groups(workloads: dict[str, dict[str, Any]]) -> list[tuple[str, str, str]]:
    """The broker groups rendered: (broker StatefulSet, front gateways' Deployment, client Service)."""
    groups = [(broker, fronts, service) for broker, (fronts, service) in GROUPS.items() if broker in workloads]
    deployments = {n for n, w in workloads.items() if w["kind"] == "Deployment"}
    assert deployments == {fronts for _, fronts, _ in groups}, f"fronts of no known group: {deployments}"
    return groups


def _etcd_flags(container: dict[str, Any]) -> dict[str, str]:
    assert container["command"][0] == "etcd", container["command"]
    flags: dict[str, str] = {}
    for arg in container["command"][1:]:
        name, sep, value = arg.partition("=")
        assert arg.startswith("--") and sep, f"etcd: {arg!r} is not --flag=value"
        assert name not in flags, f"etcd: {name} given twice"
        flags[name] = value
    return flags


def _check_etcd_container(name: str, workload: dict[str, Any]) -> None:
    """Probed on etcd's /health on its client port, and declaring exactly the ports it listens on."""
    c = _only(workload)
    flags = _etcd_flags(c)
    client, peer = (urlsplit(flags[f]) for f in ("--listen-client-urls", "--listen-peer-urls"))
    assert client.hostname == peer.hostname == "0.0.0.0", f"{name}: not listening on the pod's address"
    declared = {int(p["containerPort"]): p["name"] for p in c["ports"]}
    assert set(declared) == {client.port, peer.port}, f"{name}: declared {declared}"
    for probe in PROBES:
        get = c[probe]["httpGet"]
        assert urlsplit(get["path"]).path == "/health", f"{name}: {probe} asks {get['path']}"
        assert _container_port(workload, get["port"]) == client.port, f"{name}: {probe} not on the client port"
    # Ready only with a leader (the client Service leaves out a member cut off from the quorum); alive on its
    # own answer, so a quorum lost elsewhere restarts no member.
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "serializable=true" in urlsplit(c["livenessProbe"]["httpGet"]["path"]).query.split("&")
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert any(Path(flags["--data-dir"]).is_relative_to(m) for m in mounts), f"{name}: --data-dir is not a volume"


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=_name)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_overlays_exist() -> None:
    assert K8S / "overlays" / "master-slave" in KUSTOMIZATIONS and CLUSTER in KUSTOMIZATIONS


def test_every_object_is_valid_for_the_kubernetes_version(rendered) -> None:
    assert rendered
    for obj in rendered:
        try:
            kubernetes_validate.validate(obj, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {e.message} at {list(e.path)}")
        if obj["kind"] != "Namespace":
            assert obj["metadata"]["namespace"] == NAMESPACE


def test_every_container_is_probed_and_declares_the_ports_it_serves(rendered) -> None:
    for name, workload in _workloads(rendered).items():
        if _is_etcd(workload):
            _check_etcd_container(name, workload)
            continue
        c = _only(workload)
        served = {int(p): flag for flag in PORT_FLAGS if (p := _flag(c, flag)) is not None}
        assert len(served) == len([f for f in PORT_FLAGS if _flag(c, f) is not None]), f"{name}: a port clash"
        assert "--port" in served.values() and "--metrics-port" in served.values(), name
        # Every port listens on the pod's address (the kubelet's probes and the other pods reach it there).
        assert _flag(c, "--host") == "0.0.0.0", name
        if _flag(c, "--own-port") or _flag(c, "--internal-port"):
            assert _flag(c, "--internal-host") == "0.0.0.0", f"{name}: the fronts' ports on the pod's loopback"
        declared = {int(p["containerPort"]): p["name"] for p in c.get("ports", [])}
        assert set(declared) == set(served), f"{name}: declared ports {declared} but serves {served}"
        assert len(set(declared.values())) == len(declared), f"{name}: two ports share a name"
        port = int(_flag(c, "--port") or 0)
        for probe in PROBES:
            assert probe in c, f"{name} has no {probe}"
            assert c[probe]["grpc"]["port"] == port, f"{name}: {probe} does not ask the gateway's port"
        for probe in ("startupProbe", "readinessProbe"):
            assert c[probe]["grpc"]["service"] == "rocketstore.v1.Gateway", f"{name}: {probe}"
        mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
        config = _flag(c, "--config")
        assert config and str(Path(config).parent) in mounts, f"{name}: --config is not mounted"
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert workload["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_the_broker_pod_runs_every_service_in_one_process(rendered) -> None:
    brokers = _brokers(_workloads(rendered))
    assert BROKER in brokers
    for name, workload in brokers.items():
        c = _only(workload)
        assert c["command"][:3] == ["rocketstore", "serve", "broker"], name
        assert workload["spec"]["replicas"] == 1, f"{name}: one store, one writer"
        assert [t["metadata"]["name"] for t in workload["spec"]["volumeClaimTemplates"]] == ["store"]
        assert {m["name"] for m in c["volumeMounts"]} >= {"store"}
        # A long crash recovery must not be cut short by the liveness probe.
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600, name
        assert workload["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= 60, name


def test_the_fronts_reach_the_broker_through_its_headless_service(rendered) -> None:
    workloads = _workloads(rendered)
    for broker_name, fronts_name, _ in _groups(workloads):
        _check_fronts(rendered, workloads[broker_name], workloads[fronts_name])


def _check_fronts(rendered: list[dict[str, Any]], broker: dict[str, Any], fronts: dict[str, Any]) -> None:
    assert fronts["kind"] == "Deployment" and fronts["spec"]["replicas"] >= 2
    front, owner = _only(fronts), _only(broker)
    assert front["command"][:3] == ["rocketstore", "serve", "gateway"]
    headless = _object(rendered, "Service", broker["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert _selects(headless["spec"]["selector"], broker)
    pod_dns = f"{broker['metadata']['name']}-0.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
    for flag, broker_flag in FRONT_PEERS.items():
        endpoint = _flag(front, flag)
        assert endpoint is not None, f"the front has no {flag}"
        host, _, port = endpoint.rpartition(":")
        assert host == pod_dns, f"{flag} {endpoint} is not the broker pod's stable name"
        published = [p for p in headless["spec"]["ports"] if p["port"] == int(port)]
        assert published, f"{flag}: the headless Service does not publish {port}"
        assert _container_port(broker, published[0]["targetPort"]) == int(_flag(owner, broker_flag) or 0), flag
    # The topics copy goes into a directory of its own, never the broker's store.
    data_dir = _flag(front, "--data-dir")
    mounts = {m["mountPath"]: m["name"] for m in front["volumeMounts"]}
    volumes = {v["name"]: v for v in fronts["spec"]["template"]["spec"]["volumes"]}
    assert data_dir in mounts and "emptyDir" in volumes[mounts[data_dir]]
    assert not fronts["spec"]["template"]["spec"].get("volumeClaimTemplates")
    # The front checks and encodes sends with the broker's own settings.
    assert _flag(front, "--config") == _flag(owner, "--config")
    broker_volumes = {v["name"]: v for v in broker["spec"]["template"]["spec"]["volumes"]}
    config_mount = str(Path(_flag(front, "--config") or "").parent)
    # ... and the same cluster secret, projected beside them.
    assert (volumes[mounts[config_mount]]["projected"]
            == broker_volumes[{m["mountPath"]: m["name"] for m in owner["volumeMounts"]}[config_mount]]["projected"])
    for key in ("ROCKETSTORE_BROKER_ROLE", "ROCKETSTORE_BROKER_NAME"):
        assert _env(front).get(key) == _env(owner).get(key), f"{key}: the fronts' settings are not the broker's"


def test_the_client_service_selects_the_broker_and_the_fronts(rendered) -> None:
    workloads = _workloads(rendered)
    for broker, fronts, service_name in _groups(workloads):
        service = _object(rendered, "Service", service_name)
        selector = service["spec"]["selector"]
        assert _selects(selector, workloads[broker]) and _selects(selector, workloads[fronts])
        for name in set(workloads) - {broker, fronts}:
            assert not _selects(selector, workloads[name]), f"{service_name} selects {name}"
        for port in service["spec"]["ports"]:
            targets = {_container_port(workloads[w], port["targetPort"]) for w in (broker, fronts)}
            assert len(targets) == 1 and None not in targets, f"{port['name']} resolves to {targets}"
        assert {p["port"] for p in service["spec"]["ports"]} == {
            int(_flag(_only(workloads[broker]), f) or 0) for f in ("--port", "--metrics-port")}


def _admits(policy: dict[str, Any], port: int) -> list[list[dict[str, Any]] | None]:
    """The `from` lists of the rules admitting ``port`` (None: from anywhere)."""
    out: list[list[dict[str, Any]] | None] = []
    for rule in policy["spec"].get("ingress", []):
        if "ports" in rule and all(p["port"] != port for p in rule["ports"]):
            continue
        out.append(rule.get("from"))
    return out


def _sources(objects: list[dict[str, Any]], workload: dict[str, Any], port: int) -> list[list[dict[str, Any]] | None]:
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"
                and o["spec"]["podSelector"]["matchLabels"].items() <= _labels(workload).items()]
    assert policies, f"no NetworkPolicy selects {workload['metadata']['name']}"
    return [src for p in policies for src in _admits(p, port)]


def test_the_internal_ports_are_open_to_the_front_pods_only(rendered) -> None:
    workloads = _workloads(rendered)
    for broker_name, fronts, _ in _groups(workloads):
        c = _only(workloads[broker_name])
        allowed = {"--own-port": {fronts}, "--internal-port": {fronts}, "--ha-port": {fronts}}
        if broker_name == BROKER and SLAVE in workloads:
            allowed["--ha-port"] = {fronts, SLAVE}  # the slave replicates from the master
        for flag, peers in allowed.items():
            port = int(_flag(c, flag) or 0)
            reached = _reached_by(rendered, workloads, workloads[broker_name], port)
            assert reached == peers, f"{broker_name}'s {flag} {port} is open to {reached}, not {peers}"
        # Clients and Prometheus reach the gateway and its metrics on both kinds of pods.
        for name in (broker_name, fronts):
            for flag in ("--port", "--metrics-port"):
                port = int(_flag(_only(workloads[name]), flag) or 0)
                assert None in _sources(rendered, workloads[name], port), f"{name}: {flag} {port} closed to clients"


def _reached_by(rendered: list[dict[str, Any]], workloads: dict[str, dict[str, Any]], target: dict[str, Any],
                port: int) -> set[str]:
    """The workloads whose pods the NetworkPolicies admit to ``port`` of ``target``'s pods; fails when any
    pod (no `from`) or anything but this namespace's pods chosen by label may reach it."""
    sources = _sources(rendered, target, port)
    assert sources, f"nothing may reach {target['metadata']['name']}'s {port}"
    reached = set()
    for src in sources:
        assert src is not None, f"{target['metadata']['name']}'s {port} is open to every pod"
        for peer in src:
            assert set(peer) == {"podSelector"}, "only pods of this namespace, chosen by label"
            selected = {n for n, w in workloads.items() if _selects(peer["podSelector"]["matchLabels"], w)}
            assert selected, f"{target['metadata']['name']}'s {port}: {peer} selects no pod"
            reached |= selected
    return reached


def test_the_master_slave_overlay_runs_a_master_and_its_slave() -> None:
    objects = render(K8S / "overlays" / "master-slave")
    workloads = _workloads(objects)
    assert set(workloads) == {BROKER, SLAVE, FRONTS}
    master, slave = workloads[BROKER], workloads[SLAVE]
    m_env, s_env = _env(_only(master)), _env(_only(slave))
    assert m_env["ROCKETSTORE_BROKER_ROLE"] in ("SYNC_MASTER", "ASYNC_MASTER")
    assert s_env["ROCKETSTORE_BROKER_ROLE"] == "SLAVE" and int(s_env["ROCKETSTORE_BROKER_ID"]) > 0
    assert master["spec"]["serviceName"] != slave["spec"]["serviceName"]
    for sts in (master, slave):
        assert sts["spec"]["selector"]["matchLabels"].items() <= _labels(sts).items()
        assert not _selects(sts["spec"]["selector"]["matchLabels"], master if sts is slave else slave)
    # The fronts serve the master, with its role.
    front = _only(workloads[FRONTS])
    assert _env(front)["ROCKETSTORE_BROKER_ROLE"] == m_env["ROCKETSTORE_BROKER_ROLE"]
    assert (_flag(front, "--owner") or "").startswith(f"{BROKER}-0.{master['spec']['serviceName']}.")

    # The slave's haMasterAddress is a Service in front of the master pod's ha port.
    host, _, port = s_env["ROCKETSTORE_HA_MASTER_ADDRESS"].rpartition(":")
    svc_name, namespace = host.split(".")[:2]
    assert namespace == NAMESPACE
    service = _object(objects, "Service", svc_name)
    assert _selects(service["spec"]["selector"], master) and not _selects(service["spec"]["selector"], slave)
    ha_ports = [p for p in service["spec"]["ports"] if str(p["port"]) == port]
    assert ha_ports
    assert _container_port(master, ha_ports[0]["targetPort"]) == int(_flag(_only(master), "--ha-port") or 0)
    # The slave's own Services reach its ports by the same names.
    for svc in (o for o in objects if o["kind"] == "Service" and _selects(o["spec"]["selector"], slave)):
        for p in svc["spec"]["ports"]:
            assert _container_port(slave, p["targetPort"]) is not None, f"{svc['metadata']['name']}: {p['name']}"


def test_the_slave_is_the_master_but_the_role() -> None:
    workloads = _workloads(render(K8S / "overlays" / "master-slave"))
    master, slave = workloads[BROKER], workloads[SLAVE]
    m, s = _only(master), _only(slave)
    assert shlex.join(m["command"]) == shlex.join(s["command"])
    for key in set(m) | set(s):
        if key != "env":
            assert m.get(key) == s.get(key), f"{key} differs between master and slave"
    m_env, s_env = _env(m), _env(s)
    differing = {k for k in set(m_env) | set(s_env) if m_env.get(k) != s_env.get(k)}
    assert differing == {"ROCKETSTORE_BROKER_ROLE", "ROCKETSTORE_BROKER_ID", "ROCKETSTORE_HA_MASTER_ADDRESS"}
    m_pod, s_pod = (dict(w["spec"]["template"]["spec"], containers=None) for w in (master, slave))
    assert m_pod == s_pod
    m_claims, s_claims = (w["spec"]["volumeClaimTemplates"] for w in (master, slave))
    assert [c["spec"] for c in m_claims] == [c["spec"] for c in s_claims]


@pytest.fixture(scope="module")
def cluster() -> list[dict[str, Any]]:
    return render(CLUSTER)


def _etcd(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, str], dict[str, int]]:
    """etcd's StatefulSet, its flags and its ports by role (client, peer)."""
    etcd = _workloads(objects)[ETCD]
    flags = _etcd_flags(_only(etcd))
    return etcd, flags, {role: int(urlsplit(flags[f"--listen-{role}-urls"]).port or 0) for role in ("client", "peer")}


def test_the_cluster_overlay_runs_etcd_and_two_broker_groups(cluster) -> None:
    workloads = _workloads(cluster)
    assert set(workloads) == {ETCD, *GROUPS, *(fronts for fronts, _ in GROUPS.values())}
    assert _is_etcd(workloads[ETCD]) and workloads[ETCD]["kind"] == "StatefulSet"
    assert len(_groups(workloads)) == 2


def test_the_etcd_members_name_each_other_consistently(cluster) -> None:
    etcd, flags, ports = _etcd(cluster)
    replicas = etcd["spec"]["replicas"]
    assert replicas == 3
    # All members start together: each one serves only once a quorum of the initial cluster has joined.
    assert etcd["spec"]["podManagementPolicy"] == "Parallel"
    headless = _object(cluster, "Service", etcd["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert _selects(headless["spec"]["selector"], etcd)
    assert {_container_port(etcd, p["targetPort"]) for p in headless["spec"]["ports"]} == set(ports.values())
    assert {p["port"] for p in headless["spec"]["ports"]} == set(ports.values())

    def stable(pod: str, port: int) -> str:
        return f"http://{pod}.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local:{port}"

    pods = [f"{ETCD}-{i}" for i in range(replicas)]
    initial = dict(m.split("=", 1) for m in flags["--initial-cluster"].split(","))
    assert initial == {pod: stable(pod, ports["peer"]) for pod in pods}
    # Each member is the entry of --initial-cluster that bears its pod's name.
    env = _env(_only(etcd))
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert flags["--name"] == "$(POD_NAME)"
    for pod in pods:
        assert flags["--initial-advertise-peer-urls"].replace("$(POD_NAME)", pod) == initial[pod]
        assert flags["--advertise-client-urls"].replace("$(POD_NAME)", pod) == stable(pod, ports["client"])
    assert flags["--initial-cluster-state"] == "new" and flags["--initial-cluster-token"]
    # Voluntary disruptions leave a quorum.
    [pdb] = [o for o in cluster if o["kind"] == "PodDisruptionBudget"]
    assert _selects(pdb["spec"]["selector"]["matchLabels"], etcd)
    assert pdb["spec"]["minAvailable"] == replicas // 2 + 1


def test_every_broker_points_at_the_etcd_client_service(cluster) -> None:
    workloads = _workloads(cluster)
    etcd, _, ports = _etcd(cluster)
    service = _object(cluster, "Service", ETCD_CLIENT_SERVICE)
    assert service["spec"].get("clusterIP") != "None" and not service["spec"].get("publishNotReadyAddresses")
    assert [n for n, w in workloads.items() if _selects(service["spec"]["selector"], w)] == [ETCD]
    brokers = _brokers(workloads)
    assert set(brokers) == set(GROUPS)
    for name, broker in brokers.items():
        endpoints = _env(_only(broker)).get("ROCKETSTORE_ETCD_ENDPOINTS")
        assert endpoints, f"{name} has no etcdEndpoints"
        for endpoint in endpoints.split(";"):
            host, _, port = endpoint.rpartition(":")
            assert host == f"{ETCD_CLIENT_SERVICE}.{NAMESPACE}.svc.cluster.local", f"{name}: {endpoint}"
            [published] = [p for p in service["spec"]["ports"] if p["port"] == int(port)]
            assert _container_port(etcd, published["targetPort"]) == ports["client"], f"{name}: {endpoint}"


def test_each_group_has_its_own_name_and_store(cluster) -> None:
    brokers = _brokers(_workloads(cluster))
    names = {n: _env(_only(b)).get("ROCKETSTORE_BROKER_NAME") for n, b in brokers.items()}
    assert None not in names.values() and len(set(names.values())) == len(names), names
    claims = [f"{t['metadata']['name']}-{n}-0" for n, b in brokers.items() for t in b["spec"]["volumeClaimTemplates"]]
    assert len(set(claims)) == len(claims) == len(brokers), claims
    assert len({b["spec"]["serviceName"] for b in brokers.values()}) == len(brokers)
    for name, broker in brokers.items():
        env = _env(_only(broker))
        # Every group is a master (brokerId 0), registered with the gateway address brokerIP1 stands for.
        assert "ROCKETSTORE_BROKER_ROLE" not in env and env.get("ROCKETSTORE_BROKER_ID", "0") == "0", name
        assert env["ROCKETSTORE_BROKER_IP1"] == {"fieldRef": {"fieldPath": "status.podIP"}}, name
        assert _labels(broker)["rocketstore.io/broker-name"] == names[name]
        for other, b in brokers.items():
            assert other == name or not _selects(broker["spec"]["selector"]["matchLabels"], b), f"{name}: {other}"


def test_group_b_is_group_a_but_the_names(cluster) -> None:
    """broker-b's broker, fronts and claim are broker-a's (the base's), only named for their group."""
    workloads = _workloads(cluster)
    (a, a_fronts, _), (b, b_fronts, _) = _groups(workloads)
    a_pod, b_pod = (_only(workloads[n]) for n in (a, b))
    assert a_pod["command"] == b_pod["command"]
    assert {k: v for k, v in a_pod.items() if k != "env"} == {k: v for k, v in b_pod.items() if k != "env"}
    a_env, b_env = _env(a_pod), _env(b_pod)
    assert {k for k in set(a_env) | set(b_env) if a_env.get(k) != b_env.get(k)} == {"ROCKETSTORE_BROKER_NAME"}
    assert (dict(workloads[a]["spec"]["template"]["spec"], containers=None)
            == dict(workloads[b]["spec"]["template"]["spec"], containers=None))
    assert ([c["spec"] for c in workloads[a]["spec"]["volumeClaimTemplates"]]
            == [c["spec"] for c in workloads[b]["spec"]["volumeClaimTemplates"]])
    # The fronts: the same but the broker pod they dial (its stable name) and the group's name.
    def front(fronts: str, broker: str) -> dict[str, Any]:
        pod_dns = f"{broker}-0.{workloads[broker]['spec']['serviceName']}.{NAMESPACE}.svc.cluster.local"
        c = _only(workloads[fronts])
        return dict(c, env=None, command=[arg.replace(pod_dns, "BROKER") for arg in c["command"]])

    assert front(a_fronts, a) == front(b_fronts, b)
    assert (dict(workloads[a_fronts]["spec"]["template"]["spec"], containers=None, topologySpreadConstraints=None)
            == dict(workloads[b_fronts]["spec"]["template"]["spec"], containers=None, topologySpreadConstraints=None))
    assert (dict(workloads[a_fronts]["spec"], selector=None, template=None)
            == dict(workloads[b_fronts]["spec"], selector=None, template=None))


def test_the_cluster_service_reaches_every_gateway_of_every_group(cluster) -> None:
    workloads = _workloads(cluster)
    service = _object(cluster, "Service", CLUSTER_SERVICE)
    selected = {n for n, w in workloads.items() if _selects(service["spec"]["selector"], w)}
    assert selected == {n for broker, fronts, _ in _groups(workloads) for n in (broker, fronts)}
    for port in service["spec"]["ports"]:
        for name in selected:
            assert _container_port(workloads[name], port["targetPort"]) == int(_flag(_only(workloads[name]), "--port")
                                                                              or 0), f"{name}: {port}"


def test_etcd_is_reached_by_the_broker_pods_only(cluster) -> None:
    workloads = _workloads(cluster)
    etcd, _, ports = _etcd(cluster)
    assert _reached_by(cluster, workloads, etcd, ports["client"]) == set(_brokers(workloads)) == set(GROUPS)
    assert _reached_by(cluster, workloads, etcd, ports["peer"]) == {ETCD}
    # No other port of the etcd pods is admitted, from anywhere.
    policies = [o for o in cluster if o["kind"] == "NetworkPolicy"
                and o["spec"]["podSelector"]["matchLabels"].items() <= _labels(etcd).items()]
    for rule in (r for p in policies for r in p["spec"].get("ingress", [])):
        assert rule.get("ports") and {p["port"] for p in rule["ports"]} <= set(ports.values()), rule


# The real kustomize, installed by scripts/test.sh (`go install sigs.k8s.io/kustomize/kustomize/v5`).
KUSTOMIZE = Path(os.environ.get("ROCKETSTORE_KUSTOMIZE",
                                Path.home() / ".cache" / "rocketstore-tests" / "bin" / "kustomize"))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS, ids=_name)
def test_kustomize_builds_what_the_tests_check(kustomization: Path) -> None:
    """The real kustomize (v5, as kubectl's) builds each kustomization into the objects the renderer gives."""
    kustomize = str(KUSTOMIZE) if KUSTOMIZE.exists() else shutil.which("kustomize")
    assert kustomize, f"kustomize is not installed at {KUSTOMIZE} (scripts/test.sh installs it) nor on the PATH"
    out = subprocess.run([kustomize, "build", str(kustomization)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = {(o["kind"], o["metadata"]["name"]): o for o in yaml.safe_load_all(out.stdout) if o}
    rendered = {(o["kind"], o["metadata"]["name"]): o for o in render(kustomization)}
    assert set(built) == set(rendered)
    for key, obj in rendered.items():
        assert built[key] == obj, f"{key}: kustomize builds it otherwise"


def test_every_container_reads_the_one_cluster_secret(rendered) -> None:
    """The Secret is projected beside broker.properties, which names it (clusterSecretFile), in every pod:
    the broker, its front gateways, and a master and its slave share it."""
    properties = next(o for o in rendered if o["kind"] == "ConfigMap")["data"]["broker.properties"]
    assert "clusterSecretFile=/etc/rocketstore/cluster.secret" in properties.splitlines()
    for name, workload in _workloads(rendered).items():
        spec = workload["spec"]["template"]["spec"]
        if _is_etcd(workload):  # etcd has no use for it
            assert "rocketstore-cluster-secret" not in yaml.safe_dump(spec), f"{name} mounts the cluster secret"
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        sources = volumes["config"]["projected"]["sources"]
        secret = next(src["secret"] for src in sources if "secret" in src)
        assert secret["name"] == "rocketstore-cluster-secret"
        assert secret["items"] == [{"key": "cluster.secret", "path": "cluster.secret", "mode": 0o440}]
        for c in spec["containers"]:
            assert {"name": "config", "mountPath": "/etc/rocketstore", "readOnly": True} in c["volumeMounts"], \
                f"{name}/{c['name']} does not see the cluster secret"
            assert _flag(c, "--config") == "/etc/rocketstore/broker.properties", f"{name}/{c['name']}"


def test_the_renderer_refuses_what_it_does_not_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nconfigMapGenerator: []\n")
    with pytest.raises(RenderError, match="configMapGenerator"):
        render(tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "resources: []\npatches:\n  - patch: |-\n      - op: add\n        path: /x\n        value: 1\n"
        "    target:\n      kind: Service\n      name: nothing\n")
    with pytest.raises(RenderError, match="matches no object"):
        render(tmp_path)
    # kubectl kustomize refuses an overlay inside the directory of its base.
    (tmp_path / "kustomization.yaml").write_text("resources: []\n")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text("resources:\n  - ..\n")
    with pytest.raises(RenderError, match="cycle detected"):
        render(tmp_path / "overlay")
