"""The Kubernetes manifests: every kustomization under deploy/k8s (the single-broker base and each
overlay) renders, every object it yields is valid against the Kubernetes API schemas of
KUBERNETES_VERSION (kubernetes-validate, strict: unknown fields are errors), every container is
probed and declares exactly the ports its flags serve; the broker pod runs `serve broker` alone, the
front gateways' Deployment reaches it through its headless Service on ports it declares, the client
Service selects both kinds of pods, and the internal ports (owner, CommitLog, ha) are open to the
front pods only (and, in the master/slave overlay, the master's ha port to the slave)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
from kustomize_render import RenderError, render

KUBERNETES_VERSION = "1.30.0"
K8S = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
KUSTOMIZATIONS = [K8S, *sorted(p.parent for p in (K8S / "overlays").glob("*/kustomization.yaml"))]
NAMESPACE = "rocketstore"
BROKER, FRONTS, SLAVE = "rocketstore-broker", "rocketstore-gateway", "rocketstore-broker-slave"
CLIENT_SERVICE = "rocketstore-gateway"
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


@pytest.fixture(scope="module", params=KUSTOMIZATIONS, ids=_name)
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    return render(request.param)


def test_overlays_exist() -> None:
    assert K8S / "overlays" / "master-slave" in KUSTOMIZATIONS


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
    workloads = _workloads(rendered)
    for name, workload in workloads.items():
        if workload["kind"] != "StatefulSet":
            continue
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
    broker, fronts = workloads[BROKER], workloads[FRONTS]
    assert fronts["kind"] == "Deployment" and fronts["spec"]["replicas"] >= 2
    front, owner = _only(fronts), _only(broker)
    assert front["command"][:3] == ["rocketstore", "serve", "gateway"]
    headless = _object(rendered, "Service", broker["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert _selects(headless["spec"]["selector"], broker)
    pod_dns = f"{BROKER}-0.{headless['metadata']['name']}.{NAMESPACE}.svc.cluster.local"
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
    service = _object(rendered, "Service", CLIENT_SERVICE)
    selector = service["spec"]["selector"]
    assert _selects(selector, workloads[BROKER]) and _selects(selector, workloads[FRONTS])
    for name in set(workloads) - {BROKER, FRONTS}:
        assert not _selects(selector, workloads[name]), f"{CLIENT_SERVICE} selects {name}"
    for port in service["spec"]["ports"]:
        targets = {_container_port(workloads[w], port["targetPort"]) for w in (BROKER, FRONTS)}
        assert len(targets) == 1 and None not in targets, f"{port['name']} resolves to {targets}"
    assert {p["port"] for p in service["spec"]["ports"]} == {
        int(_flag(_only(workloads[BROKER]), f) or 0) for f in ("--port", "--metrics-port")}


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
    broker = workloads[BROKER]
    c = _only(broker)
    allowed = {"--own-port": [FRONTS], "--internal-port": [FRONTS], "--ha-port": [FRONTS]}
    if SLAVE in workloads:
        allowed["--ha-port"] = [FRONTS, SLAVE]  # the slave replicates from the master
    for flag, peers in allowed.items():
        port = int(_flag(c, flag) or 0)
        sources = _sources(rendered, broker, port)
        assert sources, f"nothing may reach the broker's {flag} {port}"
        reached = set()
        for src in sources:
            assert src is not None, f"the broker's {flag} {port} is open to every pod"
            for peer in src:
                assert set(peer) == {"podSelector"}, "only pods of this namespace, chosen by label"
                selected = {n for n, w in workloads.items() if _selects(peer["podSelector"]["matchLabels"], w)}
                assert selected and selected <= set(peers), f"{flag} {port} is open to {selected}"
                reached |= selected
        assert reached == set(peers), f"{flag} {port}: {set(peers) - reached} cannot reach it"
    # Clients and Prometheus reach the gateway and its metrics on both kinds of pods.
    for name in (BROKER, FRONTS):
        for flag in ("--port", "--metrics-port"):
            port = int(_flag(_only(workloads[name]), flag) or 0)
            assert None in _sources(rendered, workloads[name], port), f"{name}: {flag} {port} closed to clients"


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


def test_every_container_reads_the_one_cluster_secret(rendered) -> None:
    """The Secret is projected beside broker.properties, which names it (clusterSecretFile), in every pod:
    the broker, its front gateways, and a master and its slave share it."""
    properties = next(o for o in rendered if o["kind"] == "ConfigMap")["data"]["broker.properties"]
    assert "clusterSecretFile=/etc/rocketstore/cluster.secret" in properties.splitlines()
    for name, workload in _workloads(rendered).items():
        spec = workload["spec"]["template"]["spec"]
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
