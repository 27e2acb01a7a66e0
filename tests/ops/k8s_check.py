#!/usr/bin/env python3
"""Checks deploy/kubernetes: every manifest against the Kubernetes schemas (kubernetes-validate,
offline, strict: unknown fields fail), the kustomize renders of the base and each overlay (with
`kubectl kustomize` when kubectl is installed), and the rules the deployment depends on: the
namespace is created, the DaemonSet tolerates GPU nodes and selects them, updates OnDelete,
prepares the socket directory in an init container as spdld's uid, serves metrics on the pod IP
(metrics_bind 0.0.0.0) behind a Service; the cuda-ipc overlay turns on hostIPC/hostPID. Custom
resources (PodMonitor, PyTorchJob) have no schema there: their required fields are checked here.

Usage: k8s_check.py SOURCE_DIR. Run with a python that has kubernetes-validate (scripts/install-deps.sh
test puts it in /opt/spdld-test-tools). Exit 77 (ctest: Skipped) when kubernetes-validate is missing.
"""
import glob
import os
import shutil
import subprocess
import sys

try:
    import kubernetes_validate
    import yaml
except ImportError:
    print("SKIPPED: kubernetes-validate not installed (scripts/install-deps.sh test)")
    sys.exit(77)

K8S_VERSION = "1.30.0"
src = sys.argv[1]
kdir = os.path.join(src, "deploy", "kubernetes")
failures = []


def fail(msg):
    print("FAIL:", msg)
    failures.append(msg)


def validate(doc, where):
    kind = doc.get("kind")
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        print(f"ok: {where}: {kind} {doc['metadata'].get('name')}")
    except kubernetes_validate.SchemaNotFoundError:
        check_custom(doc, where)
    except kubernetes_validate.ValidationError as e:
        fail(f"{where}: {kind} {doc.get('metadata', {}).get('name')}: {e.message} at {list(e.path)}")


def check_custom(doc, where):
    kind = doc.get("kind")
    if kind == "PodMonitor" and doc.get("apiVersion") == "monitoring.coreos.com/v1":
        eps = doc.get("spec", {}).get("podMetricsEndpoints", [])
        if not doc["spec"].get("selector") or not eps or eps[0].get("port") != "metrics":
            fail(f"{where}: PodMonitor lacks a selector or the metrics port")
        else:
            print(f"ok: {where}: PodMonitor (no schema: required fields checked)")
    elif kind == "PyTorchJob" and doc.get("apiVersion") == "kubeflow.org/v1":
        specs = doc.get("spec", {}).get("pytorchReplicaSpecs", {})
        for role in ("Master", "Worker"):
            pod = specs.get(role, {}).get("template", {})
            # A pod template inside a custom resource: validate it as a Pod.
            validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"{role.lower()}-template"},
                      "spec": pod.get("spec", {})}, f"{where} ({role} template)")
    else:
        fail(f"{where}: no schema for {doc.get('apiVersion')} {kind}")


def docs_of(text, where):
    return [d for d in yaml.safe_load_all(text) if d]


# 1. Every plain manifest file (not kustomization.yaml, not the daemon config).
for path in sorted(glob.glob(os.path.join(kdir, "**", "*.yaml"), recursive=True)):
    name = os.path.basename(path)
    if name in ("kustomization.yaml", "spdld.yaml"):
        continue
    with open(path) as f:
        for d in docs_of(f.read(), path):
            validate(d, os.path.relpath(path, src))

# 2. The renders, and the rules.
kubectl = shutil.which("kubectl")
if not kubectl:
    print("SKIPPED part: kubectl not installed: kustomize renders not checked (the files were validated one by one)")
else:
    renders = {}
    for target in ("base", "overlays/cuda-ipc", "overlays/prometheus-operator"):
        r = subprocess.run([kubectl, "kustomize", os.path.join(kdir, target)], capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"kubectl kustomize {target}: {r.stderr.strip()}")
            continue
        renders[target] = docs_of(r.stdout, target)
        for d in renders[target]:
            validate(d, f"render of {target}")
    base = renders.get("base", [])
    by_kind = {d["kind"]: d for d in base}
    if by_kind.get("Namespace", {}).get("metadata", {}).get("name") != "spdld":
        fail("base does not create namespace spdld")
    for d in base:
        if d["kind"] != "Namespace" and d["metadata"].get("namespace") != "spdld":
            fail(f"base: {d['kind']} {d['metadata']['name']} is not in namespace spdld")
    ds = by_kind.get("DaemonSet")
    if not ds:
        fail("base has no DaemonSet")
    else:
        spec = ds["spec"]["template"]["spec"]
        if ds["spec"].get("updateStrategy", {}).get("type") != "OnDelete":
            fail("DaemonSet updateStrategy is not OnDelete")
        if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations", [])):
            fail("DaemonSet does not tolerate nvidia.com/gpu")
        if not spec.get("nodeSelector"):
            fail("DaemonSet has no nodeSelector")
        inits = spec.get("initContainers", [])
        uid = str(spec.get("securityContext", {}).get("runAsUser"))
        if not inits or f"-o {uid}" not in " ".join(inits[0].get("command", [])):
            fail(f"no init container makes the socket directory spdld's (uid {uid})")
        if spec.get("hostPID") or spec.get("hostIPC"):
            fail("base turns on hostPID/hostIPC (only overlays/cuda-ipc should)")
        cm_name = next(v["configMap"]["name"] for v in spec["volumes"] if "configMap" in v)
        cm = next((d for d in base if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name), None)
        if not cm:
            fail(f"the DaemonSet's ConfigMap {cm_name} is not in the render")
        else:
            conf = yaml.safe_load(cm["data"]["spdld.yaml"])
            if conf.get("metrics_bind") != "0.0.0.0" or not conf.get("metrics_port"):
                fail("the pod's config does not serve metrics on the pod IP (metrics_bind 0.0.0.0)")
    svc = by_kind.get("Service")
    if not svc or svc["spec"]["ports"][0].get("targetPort") != "metrics":
        fail("no Service for the metrics port")
    ipc = {d["kind"]: d for d in renders.get("overlays/cuda-ipc", [])}.get("DaemonSet")
    if not ipc or not (ipc["spec"]["template"]["spec"].get("hostPID") and ipc["spec"]["template"]["spec"].get("hostIPC")):
        fail("overlays/cuda-ipc does not turn on hostPID and hostIPC")
    if not any(d["kind"] == "PodMonitor" for d in renders.get("overlays/prometheus-operator", [])):
        fail("overlays/prometheus-operator has no PodMonitor")

if failures:
    print(f"FAIL: {len(failures)} problem(s)")
    sys.exit(1)
print("OK: every manifest validates; the renders hold the rules")
