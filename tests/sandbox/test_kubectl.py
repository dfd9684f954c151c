"""A real kubectl against the sandbox: apply, get, patch, wait, delete, and every CNPG sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

SAMPLES = Path(__file__).parent / "samples"
HEALTHY = "jsonpath={.status.phase}=Cluster in healthy state"
# Samples whose clusters can become healthy with nothing outside the file.
SELF_CONTAINED = [
    "cluster-example.yaml",
    "cluster-example-custom.yaml",
    "cluster-example-full.yaml",
    "cluster-example-initdb.yaml",
    "cluster-example-secret.yaml",
    "cluster-example-wal-storage.yaml",
    "cluster-example-with-backup.yaml",
    "cluster-storage-class.yaml",
    "cluster-example-bis.yaml",
]


# This sample sets a field newer than the CRDs we ship; a real server refuses it the same way.
NEWER_THAN_CRD = {"cluster-example-bis.yaml": "spec.backup.volumeSnapshot.groupSnapshot"}


def apply_sample(kubectl, namespace, sample):
    """Apply a sample; one with a field the CRD lacks goes with server-side Warn validation."""
    mode = "--validate=warn" if sample in NEWER_THAN_CRD else "--validate=strict"
    return kubectl("apply", mode, "-n", namespace, "-f", str(SAMPLES / sample))


@pytest.mark.parametrize("sample", sorted(p.name for p in SAMPLES.glob("*.yaml")))
def test_every_cnpg_sample_applies(kubectl, namespace, sample):
    proc = apply_sample(kubectl, namespace, sample)
    assert " created" in proc.stdout
    if sample in NEWER_THAN_CRD:
        assert proc.stderr == f'Warning: unknown field "{NEWER_THAN_CRD[sample]}"\n'
    else:
        assert proc.stderr == ""


def test_sample_with_unknown_field_is_refused_by_strict_validation(kubectl, namespace):
    proc = kubectl(
        "apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example-bis.yaml"), check=False
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().endswith(
        'Cluster in version "v1" cannot be handled as a Cluster: strict decoding error: '
        'unknown field "spec.backup.volumeSnapshot.groupSnapshot"'
    )


@pytest.mark.parametrize("sample", SELF_CONTAINED)
def test_self_contained_samples_reconcile_to_healthy(kubectl, namespace, sample):
    apply_sample(kubectl, namespace, sample)
    kubectl("wait", "-n", namespace, "--for", HEALTHY, "clusters", "--all", "--timeout=30s")
    out = json.loads(kubectl("get", "-n", namespace, "clusters", "-o", "json").stdout)
    for item in out["items"]:
        assert item["status"]["readyInstances"] == item["spec"]["instances"]


def test_get_prints_printer_columns(kubectl, namespace, sandbox):
    kubectl("apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example.yaml"))
    sandbox.run_until_idle()
    lines = kubectl("get", "-n", namespace, "clusters").stdout.splitlines()
    assert lines[0].split() == ["NAME", "AGE", "INSTANCES", "READY", "STATUS", "PRIMARY"]
    row = lines[1].split()
    assert row[0] == "cluster-example" and row[2:4] == ["3", "3"]
    assert " ".join(row[4:8]) == "Cluster in healthy state" and row[8] == "cluster-example-1"
    wide = kubectl("get", "-n", namespace, "clusters", "-o", "wide").stdout.splitlines()[0].split()
    assert wide[-1] == "SYNCTOPOLOGY"


def test_get_json_and_secret_table(kubectl, namespace, sandbox):
    kubectl("apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example-secret.yaml"))
    sandbox.run_until_idle()
    obj = json.loads(
        kubectl("get", "-n", namespace, "cluster", "cluster-example-secret", "-o", "json").stdout
    )
    assert (
        obj["kind"] == "Cluster" and obj["status"]["currentPrimary"] == "cluster-example-secret-1"
    )
    lines = kubectl("get", "-n", namespace, "secrets").stdout.splitlines()
    assert lines[0].split() == ["NAME", "TYPE", "DATA", "AGE"]
    assert any(
        line.split()[:3] == ["cluster-example-app-user", "kubernetes.io/basic-auth", "2"]
        for line in lines
    )


def test_apply_is_idempotent_then_configures_changes(kubectl, namespace, tmp_path):
    manifest = tmp_path / "cm.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  a: '1'\n"
    )
    assert (
        "configmap/settings created"
        in kubectl("apply", "-n", namespace, "-f", str(manifest)).stdout
    )
    assert (
        "configmap/settings unchanged"
        in kubectl("apply", "-n", namespace, "-f", str(manifest)).stdout
    )
    manifest.write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  b: '2'\n"
    )
    assert (
        "configmap/settings configured"
        in kubectl("apply", "-n", namespace, "-f", str(manifest)).stdout
    )
    data = json.loads(
        kubectl("get", "-n", namespace, "configmap", "settings", "-o", "json").stdout
    )["data"]
    assert data == {"b": "2"}


def test_server_side_apply_with_kubectl(kubectl, namespace):
    sample = str(SAMPLES / "cluster-example.yaml")
    proc = kubectl(
        "apply", "--server-side", "--field-manager=opsdeck", "-n", namespace, "-f", sample
    )
    assert "serverside-applied" in proc.stdout


def test_strict_validation_refuses_unknown_fields(kubectl, namespace, tmp_path):
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(
        "apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\nmetadata:\n  name: typo\n"
        "spec:\n  instances: 1\n  storage:\n    size: 1Gi\n  instancez: 3\n"
    )
    proc = kubectl("apply", "-n", namespace, "-f", str(manifest), check=False)
    assert proc.returncode == 1
    assert 'strict decoding error: unknown field "spec.instancez"' in proc.stderr


def test_patch_merge_then_wait_for_jsonpath(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example.yaml"))
    kubectl("wait", "-n", namespace, "--for", HEALTHY, "cluster/cluster-example", "--timeout=30s")
    proc = kubectl(
        "patch",
        "-n",
        namespace,
        "cluster",
        "cluster-example",
        "--type",
        "merge",
        "-p",
        '{"spec":{"instances":1}}',
    )
    assert "cluster.postgresql.cnpg.io/cluster-example patched" in proc.stdout
    kubectl(
        "wait",
        "-n",
        namespace,
        "--for",
        "jsonpath={.status.readyInstances}=1",
        "cluster/cluster-example",
        "--timeout=30s",
    )


def test_delete_waits_until_gone(kubectl, namespace):
    kubectl("apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example.yaml"))
    proc = kubectl(
        "delete", "-n", namespace, "cluster", "cluster-example", "--wait", "--timeout=30s"
    )
    assert 'cluster.postgresql.cnpg.io "cluster-example" deleted' in proc.stdout
    gone = kubectl("get", "-n", namespace, "cluster", "cluster-example", check=False)
    assert gone.returncode == 1
    assert 'clusters.postgresql.cnpg.io "cluster-example" not found' in gone.stderr


def test_describe_and_events_show_operator_events(kubectl, namespace, sandbox):
    kubectl("apply", "-n", namespace, "-f", str(SAMPLES / "cluster-example.yaml"))
    kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "cluster/cluster-example", "--timeout=30s"
    )
    described = kubectl("describe", "-n", namespace, "cluster", "cluster-example").stdout
    assert "Phase:                  Cluster in healthy state" in described
    assert "Normal  ClusterReady" in described
    lines = kubectl("get", "-n", namespace, "events").stdout.splitlines()
    assert lines[0].split() == ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"]
    assert "cluster/cluster-example" in lines[1]
