"""The Kubernetes manifests: every kustomization under deploy/k8s (the single-broker base and each
overlay) renders, every object it yields is valid against the Kubernetes API schemas of
KUBERNETES_VERSION (kubernetes-validate, strict: unknown fields are errors), every container is
probed, and the master/slave overlay deploys broker-a as a master and a slave whose ha port only
the slave can reach."""

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
SERVICES = {"commitlog", "index", "dispatcher", "schedule", "gateway"}


def _name(path: Path) -> str:
    return str(path.relative_to(K8S.parent)) if path != K8S else "deploy/k8s"


def _pods(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == "StatefulSet"}


def _flag(container: dict[str, Any], flag: str) -> str | None:
    cmd = container["command"]
    return cmd[cmd.index(flag) + 1] if flag in cmd else None


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


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
            assert obj["metadata"]["namespace"] == "rocketstore"


def test_every_container_is_probed_and_ports_do_not_clash(rendered) -> None:
    for name, sts in _pods(rendered).items():
        ports: dict[str, str] = {}
        for c in sts["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in c, f"{name}/{c['name']} has no {probe}"
            for flag in ("--port", "--metrics-port"):
                port = _flag(c, flag)
                assert port is not None, f"{name}/{c['name']} has no {flag}"
                assert port not in ports, f"{name}: {c['name']} and {ports[port]} both use port {port}"
                ports[port] = c["name"]
            for p in c.get("ports", []):
                assert str(p["containerPort"]) in ports, f"{name}/{c['name']} declares a port it does not serve"
            # A probe of a loopback-only service must run inside the container.
            if _flag(c, "--host") == "127.0.0.1":
                assert all("exec" in c[p] for p in ("startupProbe", "readinessProbe", "livenessProbe"))


def test_the_master_slave_overlay_runs_a_master_and_its_slave() -> None:
    objects = render(K8S / "overlays" / "master-slave")
    pods = _pods(objects)
    assert set(pods) == {"rocketstore-broker", "rocketstore-broker-slave"}
    master, slave = pods["rocketstore-broker"], pods["rocketstore-broker-slave"]
    roles = {}
    for sts in (master, slave):
        spec = sts["spec"]
        containers = {c["name"]: c for c in spec["template"]["spec"]["containers"]}
        assert set(containers) == SERVICES | {"ha"}
        assert spec["replicas"] == 1
        assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["store"]  # its own claim
        assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
        envs = [_env(c) for c in containers.values()]
        assert len({e["ROCKETSTORE_BROKER_ROLE"] for e in envs}) == 1, "one role for every container"
        roles[sts["metadata"]["name"]] = envs[0]
        ha = containers["ha"]
        assert _flag(ha, "--port") == envs[0]["ROCKETSTORE_HA_LISTEN_PORT"]
        assert _flag(ha, "--port") != _flag(containers["index"], "--port"), "haListenPort must not be the index's"
        assert _flag(ha, "--host") == "0.0.0.0" and _flag(ha, "--commitlog") == "127.0.0.1:10911"
    assert roles["rocketstore-broker"]["ROCKETSTORE_BROKER_ROLE"] in ("SYNC_MASTER", "ASYNC_MASTER")
    slave_env = roles["rocketstore-broker-slave"]
    assert slave_env["ROCKETSTORE_BROKER_ROLE"] == "SLAVE" and int(slave_env["ROCKETSTORE_BROKER_ID"]) > 0

    # The slave's haMasterAddress is a Service in front of the master pod's ha port.
    host, _, port = slave_env["ROCKETSTORE_HA_MASTER_ADDRESS"].rpartition(":")
    svc_name, namespace = host.split(".")[:2]
    assert namespace == "rocketstore"
    service = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == svc_name)
    master_labels = master["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= master_labels.items()
    assert not service["spec"]["selector"].items() <= slave["spec"]["template"]["metadata"]["labels"].items()
    ha_ports = [p for p in service["spec"]["ports"] if str(p["port"]) == port]
    assert ha_ports and ha_ports[0]["targetPort"] in {
        cp["name"] for c in master["spec"]["template"]["spec"]["containers"] for cp in c.get("ports", [])
        if str(cp["containerPort"]) == port}


def _admits(policy: dict[str, Any], port: int) -> list[dict[str, Any] | None]:
    """The `from` lists of the rules admitting ``port`` (None: from anywhere)."""
    out: list[dict[str, Any] | None] = []
    for rule in policy["spec"].get("ingress", []):
        if "ports" in rule and all(p["port"] != port for p in rule["ports"]):
            continue
        out.append(rule.get("from"))
    return out


def test_only_the_slave_reaches_the_masters_ha_port() -> None:
    objects = render(K8S / "overlays" / "master-slave")
    pods = _pods(objects)
    master_labels = pods["rocketstore-broker"]["spec"]["template"]["metadata"]["labels"]
    slave_labels = pods["rocketstore-broker-slave"]["spec"]["template"]["metadata"]["labels"]
    ha_port = int(_flag(next(c for c in pods["rocketstore-broker"]["spec"]["template"]["spec"]["containers"]
                             if c["name"] == "ha"), "--port"))
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"
                and o["spec"]["podSelector"]["matchLabels"].items() <= master_labels.items()]
    assert policies, "no NetworkPolicy selects the master pod"
    sources = [src for p in policies for src in _admits(p, ha_port)]
    assert sources, "nothing may reach the master's ha port: the slave cannot replicate"
    for src in sources:
        assert src is not None, "the master's ha port is open to every pod"
        for peer in src:
            assert set(peer) == {"podSelector"}, "only pods of this namespace, chosen by label"
            assert peer["podSelector"]["matchLabels"].items() <= slave_labels.items()
            assert not peer["podSelector"]["matchLabels"].items() <= master_labels.items()


def test_the_slave_container_settings_are_the_masters_but_the_role() -> None:
    pods = _pods(render(K8S / "overlays" / "master-slave"))
    for name in SERVICES | {"ha"}:
        m, s = ({c["name"]: c for c in pods[p]["spec"]["template"]["spec"]["containers"]}[name]
                for p in ("rocketstore-broker", "rocketstore-broker-slave"))
        assert shlex.join(m["command"]) == shlex.join(s["command"])
        for key in ("image", "resources", "securityContext", "volumeMounts", "startupProbe", "readinessProbe",
                    "livenessProbe"):
            assert m.get(key) == s.get(key), f"{name}: {key} differs between master and slave"


def test_every_container_reads_the_one_cluster_secret(rendered) -> None:
    """The Secret is projected beside broker.properties, which names it (clusterSecretFile), in every pod:
    the services of a pod, and a master and its slave, share it."""
    properties = next(o for o in rendered if o["kind"] == "ConfigMap")["data"]["broker.properties"]
    assert "clusterSecretFile=/etc/rocketstore/cluster.secret" in properties.splitlines()
    for name, sts in _pods(rendered).items():
        spec = sts["spec"]["template"]["spec"]
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
