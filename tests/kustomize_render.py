"""A renderer for the subset of kustomize that ``deploy/k8s`` uses, so the tests can check what
``kubectl apply -k`` would create without the kustomize binary.

Supported kustomization keys: ``resources`` (files and directories holding a kustomization),
``patches`` (a ``path`` or inline ``patch``, strategic merge or a JSON 6902 list with a ``target``),
``patchesStrategicMerge``, ``namespace``, ``namePrefix``, ``nameSuffix``, ``labels`` (``pairs`` with
``includeSelectors`` / ``includeTemplates``), ``commonLabels`` and ``images`` (``newName``,
``newTag``). Any other key fails the render, so a manifest never relies on a feature that is not
rendered here. Strategic merge follows Kubernetes' patch merge keys for the lists the manifests
patch (containers and env by name, volumeMounts by mountPath, ports by containerPort or port),
ordered as kustomize orders them (the patch's items first, then the base's others); other lists are
replaced. Name references are not rewritten, so prefixes and suffixes are refused in a
kustomization whose resources refer to each other by name. As kustomize, it refuses a
directory resource that contains a kustomization which refers to it (an overlay inside its base).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

__all__ = ["RenderError", "render"]

Obj = dict[str, Any]

SUPPORTED = {"apiVersion", "kind", "resources", "patches", "patchesStrategicMerge", "namespace", "namePrefix",
             "nameSuffix", "labels", "commonLabels", "images"}
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass",
                  "CustomResourceDefinition"}
MERGE_KEYS = {"containers": "name", "initContainers": "name", "env": "name", "volumes": "name",
              "volumeMounts": "mountPath", "volumeClaimTemplates": None}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}


class RenderError(ValueError):
    """The kustomization uses something this renderer does not, or a patch matches nothing."""


def render(directory: str | Path, _visited: tuple[Path, ...] = ()) -> list[Obj]:
    """The objects ``kustomize build directory`` would produce (for the supported subset)."""
    root = Path(directory).resolve()
    for seen in _visited:  # kustomize's cycle check: an overlay may not live inside its base's directory
        if seen.is_relative_to(root):
            raise RenderError(f"cycle detected: {root} contains {seen}, which refers to it")
    kfile = root / "kustomization.yaml"
    if not kfile.exists():
        raise RenderError(f"{root} has no kustomization.yaml")
    k = yaml.safe_load(kfile.read_text()) or {}
    unknown = set(k) - SUPPORTED
    if unknown:
        raise RenderError(f"{kfile}: unsupported kustomization keys {sorted(unknown)}")
    objects: list[Obj] = []
    for res in k.get("resources", []):
        path = (root / res).resolve()
        if path.is_dir():
            objects += render(path, (*_visited, root))
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d]
    for entry in k.get("patchesStrategicMerge", []):
        for doc in yaml.safe_load_all((root / entry).read_text()):
            _apply_strategic(objects, doc, str(root / entry))
    for entry in k.get("patches", []):
        _apply_patch(objects, root, entry)
    if k.get("namePrefix") or k.get("nameSuffix"):
        raise RenderError(f"{kfile}: namePrefix/nameSuffix would need name references rewritten")
    for obj in objects:
        if "namespace" in k and obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = k["namespace"]
        for spec in k.get("labels", []):
            _add_labels(obj, spec.get("pairs", {}), spec.get("includeSelectors", False),
                        spec.get("includeTemplates", spec.get("includeSelectors", False)))
        if k.get("commonLabels"):
            _add_labels(obj, k["commonLabels"], True, True)
        for image in k.get("images", []):
            _set_image(obj, image)
    return objects


def _apply_patch(objects: list[Obj], root: Path, entry: Obj) -> None:
    where = str(root / entry["path"]) if "path" in entry else f"{root}/kustomization.yaml (inline patch)"
    text = (root / entry["path"]).read_text() if "path" in entry else entry["patch"]
    doc = yaml.safe_load(text)
    if isinstance(doc, list):  # JSON 6902
        target = entry.get("target")
        if not target:
            raise RenderError(f"{where}: a JSON 6902 patch needs a target")
        matched = [o for o in objects if _matches(o, target)]
        if not matched:
            raise RenderError(f"{where}: the target {target} matches no object")
        for obj in matched:
            for op in doc:
                _json6902(obj, op, where)
        return
    if entry.get("target"):
        for obj in [o for o in objects if _matches(o, entry["target"])]:
            merged = _merge(obj, doc)
            obj.clear()
            obj.update(merged)
        return
    _apply_strategic(objects, doc, where)


def _apply_strategic(objects: list[Obj], patch: Obj, where: str) -> None:
    target = {"kind": patch["kind"], "name": patch["metadata"]["name"]}
    matched = [o for o in objects if _matches(o, target)]
    if len(matched) != 1:
        raise RenderError(f"{where}: the patch for {target} matches {len(matched)} objects")
    merged = _merge(matched[0], patch)
    matched[0].clear()
    matched[0].update(merged)


def _matches(obj: Obj, target: Obj) -> bool:
    return all(obj.get(k) == v if k == "kind" else obj["metadata"].get(k) == v
               for k, v in target.items() if k in ("kind", "name", "namespace"))


def _merge(base: Any, patch: Any, field: str = "") -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        out = copy.deepcopy(base)
        for key, value in patch.items():
            out[key] = _merge(out[key], value, key) if key in out else copy.deepcopy(value)
        return out
    if isinstance(base, list) and isinstance(patch, list):
        key = MERGE_KEYS.get(field, "port" if field == "ports" else None)
        if field == "ports" and base and "containerPort" in base[0]:
            key = "containerPort"
        if key is None or not all(isinstance(i, dict) and key in i for i in base + patch):
            return copy.deepcopy(patch)
        # As kubectl kustomize orders them: the patch's items (merged into the base's of the same key), then
        # the base's other items, in their order.
        by_key = {item[key]: item for item in base}
        patched = [_merge(by_key[item[key]], item) if item[key] in by_key else copy.deepcopy(item) for item in patch]
        keys = {item[key] for item in patch}
        return patched + [copy.deepcopy(item) for item in base if item[key] not in keys]
    return copy.deepcopy(patch)


def _json6902(obj: Obj, op: Obj, where: str) -> None:
    parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].lstrip("/").split("/")]
    parent: Any = obj
    for p in parts[:-1]:
        parent = parent[int(p)] if isinstance(parent, list) else parent[p]
    last = parts[-1]
    kind = op["op"]
    if kind in ("add", "replace"):
        if isinstance(parent, list):
            if last == "-":
                parent.append(copy.deepcopy(op["value"]))
            elif kind == "add":
                parent.insert(int(last), copy.deepcopy(op["value"]))
            else:
                parent[int(last)] = copy.deepcopy(op["value"])
        else:
            if kind == "replace" and last not in parent:
                raise RenderError(f"{where}: replace of a missing path {op['path']}")
            parent[last] = copy.deepcopy(op["value"])
    elif kind == "remove":
        del parent[int(last) if isinstance(parent, list) else last]
    else:
        raise RenderError(f"{where}: unsupported JSON 6902 op {kind!r}")


def _add_labels(obj: Obj, pairs: dict[str, str], selectors: bool, templates: bool) -> None:
    obj["metadata"].setdefault("labels", {}).update(pairs)
    spec = obj.get("spec") or {}
    if selectors:
        if obj["kind"] == "Service":
            spec.setdefault("selector", {}).update(pairs)
        elif obj["kind"] in WORKLOADS:
            spec.setdefault("selector", {}).setdefault("matchLabels", {}).update(pairs)
    if templates and obj["kind"] in WORKLOADS:
        spec["template"].setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _set_image(obj: Obj, image: Obj) -> None:
    if obj["kind"] not in WORKLOADS:
        return
    pod = obj["spec"]["template"]["spec"]
    for c in pod.get("containers", []) + pod.get("initContainers", []):
        name, _, tag = c["image"].partition(":")
        if name == image["name"]:
            c["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag)}"
