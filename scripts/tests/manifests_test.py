#!/usr/bin/env python3
"""Tests of deploy/ (issue 27 items 2 and 4): the Kustomize base and the Helm
chart render, every object validates strictly against Kubernetes' schemas
(1.32 and 1.37, kubernetes-validate), the chart's default values give the
same objects as the Kustomize base, each value changes what it should, the
installer accepts every flag the manifests pass it, and the YAML blocks of
docs/kubernetes.md and the README validate too.

Run by scripts/tests/manifests.sh (which fetches helm, kubectl and the venv
with scripts/lib/k8s-tools.sh) with NRI_K8S_TOOLS and NRI_INSTALLER_BIN set.
"""

import os
import re
import subprocess
import sys
import unittest

import kubernetes_validate
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOOLS = os.environ["NRI_K8S_TOOLS"]
HELM = os.path.join(TOOLS, "bin", "helm")
KUBECTL = os.path.join(TOOLS, "bin", "kubectl")
INSTALLER = os.environ["NRI_INSTALLER_BIN"]
CHART = os.path.join(ROOT, "deploy", "helm", "nri-shim")
KUSTOMIZE = os.path.join(ROOT, "deploy", "kustomize")
VERSIONS = ["1.32.0", "1.37.0"]


def run(*cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout}{p.stderr}")
    return p.stdout


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def helm(*sets, namespace="nri-shim"):
    args = [HELM, "template", "nri-shim", CHART, "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    return docs(run(*args))


def kustomize():
    return docs(run(KUBECTL, "kustomize", KUSTOMIZE))


def by_kind(objs):
    return {(o["kind"], o["metadata"]["name"]): o for o in objs}


def one(objs, kind):
    found = [o for o in objs if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def installer(objs):
    return one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]


class Validate:
    def assert_valid(self, objs, what):
        self.assertTrue(objs, f"{what} rendered nothing")
        for o in objs:
            for v in VERSIONS:
                try:
                    kubernetes_validate.validate(o, v, strict=True)
                except kubernetes_validate.ValidationError as e:
                    self.fail(f"{what}: {o['kind']} {o['metadata'].get('name')} against Kubernetes {v}: {e.message} at {list(e.path)}")


class Manifests(unittest.TestCase, Validate):
    def test_kustomize_base_renders_and_validates(self):
        objs = kustomize()
        self.assert_valid(objs, "deploy/kustomize")
        kinds = sorted(o["kind"] for o in objs)
        self.assertEqual(kinds, sorted([
            "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding",
            "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "DaemonSet", "RuntimeClass"]))
        ns = one(objs, "Namespace")
        self.assertEqual(ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged")
        ds = one(objs, "DaemonSet")
        pod = ds["spec"]["template"]["spec"]
        self.assertTrue(pod["hostPID"])
        self.assertNotIn("hostNetwork", pod)
        self.assertNotIn("hostIPC", pod)
        self.assertEqual(pod["volumes"], [{"name": "host", "hostPath": {"path": "/", "type": "Directory"}}])
        rc = one(objs, "RuntimeClass")
        label = [a for a in installer(objs)["args"] if a.startswith("--node-label=")][0].split("=", 1)[1]
        key, value = label.split("=", 1)
        self.assertEqual(rc["scheduling"]["nodeSelector"], {key: value},
                         "the RuntimeClass schedules onto the label the installer sets")
        self.assertIn(f"--runtime-name={rc['handler']}", installer(objs)["args"])

    def test_rbac_grants_only_the_node_patch_and_its_own_daemonset(self):
        objs = by_kind(kustomize())
        self.assertEqual(objs[("ClusterRole", "nri-shim-installer")]["rules"],
                         [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}])
        self.assertEqual(objs[("Role", "nri-shim-installer")]["rules"],
                         [{"apiGroups": ["apps"], "resources": ["daemonsets"],
                           "resourceNames": ["nri-shim-installer"], "verbs": ["get"]}])
        policy = objs[("ValidatingAdmissionPolicy", "nri-shim-installer-own-node")]
        self.assertIn('"system:serviceaccount:nri-shim:nri-shim-installer"',
                      policy["spec"]["matchConditions"][0]["expression"])
        self.assertEqual(policy["spec"]["variables"][0]["expression"], '"nri-shim.io/runtime"')

    def test_helm_chart_lints_and_its_defaults_are_the_kustomize_base(self):
        run(HELM, "lint", "--strict", CHART)
        chart = helm()
        self.assert_valid(chart, "the chart's defaults")
        base = by_kind(kustomize())
        base.pop(("Namespace", "nri-shim"))
        self.assertEqual(by_kind(chart), base)

    def test_every_installer_flag_the_manifests_pass_is_one_it_knows(self):
        help_text = run(INSTALLER, "install", "--help")
        known = set(re.findall(r"--[a-z][a-z-]+", help_text))
        everything = ["containerd.config=/etc/containerd/config.toml", "shimConfig=/etc/nri-shim/config.toml",
                      "containerd.systemdUnit=containerd.service", "containerd.default=true",
                      "containerd.asRunc=true"]
        for objs in (kustomize(), helm(), helm(*everything)):
            c = installer(objs)
            self.assertEqual(c["args"][0], "install")
            for a in c["args"][1:]:
                flag = a.split("=", 1)[0]
                self.assertIn(flag, known, f"nri-shim-installer install has no {flag}")
            self.assertEqual(c["readinessProbe"]["exec"]["command"], ["/usr/bin/nri-shim-installer", "ready"])
        run(INSTALLER, "ready", "--help")

    def test_chart_values_change_what_they_should(self):
        objs = helm(
            "image.repository=registry.example/nri/installer", "image.tag=9.9.9", "image.pullPolicy=Always",
            "name=shim-installer", "runtimeClass.name=nri-fast", "handler=nri-fast-handler",
            "nodeLabel.key=example.com/nri", "nodeLabel.value=yes",
            "nodeSelector.pool=gpu", "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
            "tolerations[0].effect=NoSchedule", "priorityClassName=", "terminationGracePeriodSeconds=60",
            "containerd.address=/run/k3s/containerd/containerd.sock",
            "containerd.config=/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            "containerd.restart=signal", "containerd.systemdCgroup=true", "containerd.nri=disable",
            "containerd.default=true", "containerd.asRunc=true", "containerd.systemdUnit=k3s-agent.service",
            "shimConfig=/etc/nri-shim/node.toml", "imagePullSecrets[0].name=pull",
            namespace="node-runtime")
        self.assert_valid(objs, "the chart with every value set")
        o = by_kind(objs)
        ds = o[("DaemonSet", "shim-installer")]
        pod = ds["spec"]["template"]["spec"]
        c = pod["containers"][0]
        self.assertEqual(c["image"], "registry.example/nri/installer:9.9.9")
        self.assertEqual(c["imagePullPolicy"], "Always")
        self.assertEqual(pod["nodeSelector"], {"kubernetes.io/os": "linux", "pool": "gpu"})
        self.assertEqual(pod["tolerations"], [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}])
        self.assertNotIn("priorityClassName", pod)
        self.assertEqual(pod["terminationGracePeriodSeconds"], 60)
        self.assertEqual(pod["imagePullSecrets"], [{"name": "pull"}])
        self.assertEqual(pod["serviceAccountName"], "shim-installer")
        self.assertEqual(ds["metadata"]["namespace"], "node-runtime")
        self.assertEqual(c["args"], [
            "install", "--root=/host",
            "--containerd-address=/run/k3s/containerd/containerd.sock",
            "--containerd-config=/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            "--shim-config=/etc/nri-shim/node.toml",
            "--runtime-name=nri-fast-handler",
            "--node-label=example.com/nri=yes",
            "--systemd-cgroup=true", "--containerd-nri=disable", "--restart=signal",
            "--systemd-unit=k3s-agent.service", "--default", "--as-runc"])
        self.assertIn({"name": "DAEMONSET_NAME", "value": "shim-installer"}, c["env"])
        rc = o[("RuntimeClass", "nri-fast")]
        self.assertEqual(rc["handler"], "nri-fast-handler")
        self.assertEqual(rc["scheduling"]["nodeSelector"], {"example.com/nri": "yes"})
        self.assertEqual(o[("Role", "shim-installer")]["rules"][0]["resourceNames"], ["shim-installer"])
        self.assertEqual(o[("ClusterRoleBinding", "shim-installer")]["subjects"],
                         [{"kind": "ServiceAccount", "name": "shim-installer", "namespace": "node-runtime"}])
        policy = o[("ValidatingAdmissionPolicy", "shim-installer-own-node")]["spec"]
        self.assertEqual(policy["matchConditions"][0]["expression"],
                         'request.userInfo.username == "system:serviceaccount:node-runtime:shim-installer"')
        self.assertEqual(policy["variables"][0]["expression"], '"example.com/nri"')
        self.assertEqual(o[("ValidatingAdmissionPolicyBinding", "shim-installer-own-node")]["spec"]["policyName"],
                         "shim-installer-own-node")

        off = by_kind(helm("ownNodePolicy.enabled=false", "runtimeClass.create=false"))
        self.assertEqual(sorted(k for k, _ in off),
                         ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Role", "RoleBinding", "ServiceAccount"])

    def test_the_docs_yaml_validates(self):
        blocks = []
        for page in ("docs/kubernetes.md", "README.md"):
            text = open(os.path.join(ROOT, page)).read()
            for b in re.findall(r"```yaml\n(.*?)```", text, re.S):
                blocks += [(page, d) for d in docs(b)]
        self.assertGreaterEqual(len(blocks), 2, "docs/kubernetes.md shows a RuntimeClass pod")
        for page, d in blocks:
            self.assert_valid([d], page)
        pods = [d for _, d in blocks if d["kind"] == "Pod"]
        self.assertTrue(pods and all(p["spec"]["runtimeClassName"] == "nri-shim" for p in pods))


if __name__ == "__main__":
    unittest.main(verbosity=2)
