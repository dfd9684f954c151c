"""`manage.py spec_test`: a spec's workflows run, in order, on a fresh sandbox cluster."""

from dataclasses import replace
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from deployments import spectest
from deployments.spec import load_spec
from deployments.spec.model import Parameter

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "specs" / "postgres-cnpg.yaml"
PUBLIC = ROOT / "tests" / "engine" / "specs"


def spec_test(path, *args) -> tuple[str, CommandError | None]:
    out = StringIO()
    try:
        call_command("spec_test", str(path), *args, stdout=out)
    except CommandError as exc:
        return out.getvalue(), exc
    return out.getvalue(), None


def rows(output: str) -> dict[str, str]:
    """verb → result, from the table the command prints."""
    table = {}
    for line in output.splitlines():
        for result in spectest.RESULTS:
            head, sep, _ = line.partition(f" {result} ")
            if sep and not line.startswith(" "):
                table[head.strip()] = result
    return table


def broken_create(tmp_path, *, deadline: int) -> Path:
    """The shipped spec, with a create whose cluster can never count as healthy."""
    text = SPEC.read_text()
    create, rest = text.split("      modify:\n", 1)
    create = create.replace("activeDeadlineSeconds: 3600", f"activeDeadlineSeconds: {deadline}")
    create = create.replace(
        '                  cel: self.status.phase == "Cluster in healthy state"\n',
        '                  cel: self.status.phase == "never"\n',
        1,
    )
    path = tmp_path / "broken.yaml"
    path.write_text(create + "      modify:\n" + rest)
    return path


def test_every_verb_of_the_shipped_spec_passes():
    output, error = spec_test(SPEC)

    assert error is None, output
    table = rows(output)
    for verb in load_spec(SPEC.read_text()).main.verbs:
        assert table[verb] == "passed", output
    assert table["delete (restored)"] == "passed"
    assert table["addCapacity"] == table["removeCapacity"] == "skipped"
    assert output.splitlines()[0].split() == ["verb", "result", "duration"]
    assert output.splitlines()[-1] == "14 passed, 0 failed, 2 skipped"


@pytest.mark.parametrize("name", ["examples-cnpg.yaml", "postgres-paas-operator-byoa-spec.yaml"])
def test_public_omnistrate_specs_pass_and_their_absent_verbs_are_skipped(name):
    output, error = spec_test(PUBLIC / name)

    assert error is None, output
    table = rows(output)
    assert table["create"] == table["modify"] == table["delete"] == "passed"
    for verb in ("stop", "start", "restart", "backup", "restore", "deleteBackup"):
        assert table[verb] == "skipped"
    assert table["applyBackupRetention"] == "skipped"  # Opsdeck's own verb
    assert output.splitlines()[-1] == "3 passed, 0 failed, 10 skipped"


def test_a_create_that_never_becomes_healthy_fails_and_nothing_runs_after_it(tmp_path):
    output, error = spec_test(broken_create(tmp_path, deadline=1))

    assert error is not None and "1 verb(s)" in str(error)
    lines = output.splitlines()
    create = next(i for i, line in enumerate(lines) if line.startswith("create "))
    assert rows(output)["create"] == "failed"
    assert lines[create + 1].strip().startswith("The workflow exceeded its deadline of 1 s. ")
    assert "It was still waiting on Cluster " in lines[create + 1]
    table = rows(output)
    assert table["modify"] == table["backup"] == table["delete"] == "not run"
    assert table["rotateCredentials"] == "not run"
    assert table["addCapacity"] == "skipped"
    assert lines[-1] == "0 passed, 1 failed, 2 skipped, 12 not run"


def test_a_stuck_verb_fails_at_the_wall_clock_cap_naming_the_task(tmp_path):
    output, error = spec_test(broken_create(tmp_path, deadline=3600), "--timeout", "1")

    assert error is not None
    assert rows(output)["create"] == "failed"
    assert "did not finish within 1 s; still waiting for main.cluster" in output


def test_an_operator_failure_is_reported_with_the_task_and_its_condition(monkeypatch):
    monkeypatch.setattr(spectest, "new_instance_id", lambda: "inst-broken01")
    faults = {"fail_bootstrap": ["inst-broken01/inst-broken01"]}
    with spectest.sandbox_driver(speed=50, faults=faults) as (_, driver):
        results = spectest.run(load_spec(SPEC.read_text()), driver)

    create = results[0]
    assert (create.verb, create.result) == ("create", "failed")
    assert create.error.startswith('cluster: Cluster "inst-broken01" failed')
    assert {r.result for r in results[1:]} == {"not run", "skipped"}


def test_keep_leaves_the_sandbox_up_until_interrupted(tmp_path, monkeypatch):
    from deployments.management.commands import spec_test as command

    class Interrupted:
        @staticmethod
        def sleep(seconds):
            raise KeyboardInterrupt

    monkeypatch.setattr(command, "time", Interrupted)
    output, error = spec_test(broken_create(tmp_path, deadline=1), "--keep")

    assert error is not None
    assert "The sandbox keeps running at http://127.0.0.1:" in output
    assert "kubeconfig: " in output and "Press Ctrl-C to stop it." in output


# A spec of ConfigMaps that write down what $sys holds, so the values can be read back.
PROBE = """
name: Probe
x-opsdeck: {kinds: [ConfigMap]}
services:
  - name: probe
    capabilities:
      backupConfiguration: {backupRetentionInDays: 1, backupPeriodInHours: 24}
    apiParameters:
      - {key: instanceType, type: String, modifiable: false, defaultValue: m5.large}
      - {key: size, type: Float64, modifiable: true, defaultValue: "3", limits: {min: 1, max: 3}}
    endpointConfiguration:
      writer: {host: "{{ $sys.id }}-writer", ports: [7000], primary: true}
    operatorCRDConfiguration: {helmChartDependencies: []}
    systemWorkflows:
      create: &write
        outputParameters:
          region: "$tasks.cm.resource.data.region"
          cloud: "$tasks.cm.resource.data.cloud"
          subnets: "$tasks.cm.resource.data.subnets"
          instanceType: "$tasks.cm.resource.data.instanceType"
          endpoint: "$tasks.cm.resource.data.endpoint"
          destination: "$tasks.cm.resource.data.destination"
          size: "$tasks.cm.resource.data.size"
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 60
          templates:
            - name: main
              dag: {tasks: [{name: cm, template: cm}]}
            - name: cm
              resource:
                action: apply
                successCondition: "cel: true"
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{ $sys.id }}"}
                  data:
                    region: "{{ $sys.deploymentCell.region }}"
                    cloud: "{{ $sys.deploymentCell.cloudProviderName }}"
                    subnets: "{{ $sys.deploymentCell.privateSubnetIDs[*].id }}"
                    instanceType: "{{ $sys.compute.node.instanceType }}"
                    endpoint: "{{ $sys.network.externalClusterEndpoint }}"
                    destination: "{{ $sys.backup.destinationPath }}"
                    size: "{{ $var.size }}"
      modify: *write
      delete:
        workflow:
          entrypoint: rm
          activeDeadlineSeconds: 60
          templates:
            - name: rm
              resource:
                action: delete
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{ $sys.id }}"}
      backup:
        outputParameters:
          taken: "$tasks.snap.resource.data.id"
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 60
          templates:
            - name: main
              dag: {tasks: [{name: snap, template: snap}]}
            - name: snap
              resource:
                action: apply
                successCondition: "cel: true"
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{ $sys.snapshot.id }}"}
                  data: {id: "{{ $sys.snapshot.id }}"}
      restore:
        outputParameters:
          snapshot: "$tasks.cm.resource.data.snapshot"
          taken: "$tasks.cm.resource.data.taken"
          source: "$tasks.cm.resource.data.source"
          target: "$tasks.cm.resource.data.target"
          namespace: "$tasks.cm.resource.metadata.namespace"
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 60
          templates:
            - name: main
              dag: {tasks: [{name: cm, template: cm}]}
            - name: cm
              resource:
                action: apply
                successCondition: "cel: true"
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{ $sys.id }}"}
                  data:
                    snapshot: "{{ $sys.restore.snapshotId }}"
                    taken: "{{ $sys.restore.metadata.taken }}"
                    source: "{{ $sys.sourceInstanceId }}"
                    target: "{{ $sys.targetInstanceId }}"
      deleteBackup:
        workflow:
          entrypoint: rm
          activeDeadlineSeconds: 60
          templates:
            - name: rm
              resource:
                action: delete
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{ $sys.snapshot.id }}"}
"""


def test_sys_holds_the_documented_defaults_and_restore_sees_the_backup():
    with spectest.sandbox_driver(speed=50) as (_, driver):
        results = {r.verb: r for r in spectest.run(load_spec(PROBE), driver)}

    assert {r.result for r in results.values()} == {"passed", "skipped"}
    create = results["create"].outputs
    instance = create["endpoint"].split("-writer.")[0]
    assert create == {
        "region": "local",
        "cloud": "sandbox",
        "subnets": "subnet-a,subnet-b",
        "instanceType": "m5.large",
        "endpoint": f"{instance}-writer.{instance}",  # the spec's endpoint, in its namespace
        "destination": f"s3://spec-test/backups/spec-test/{instance}",
        "size": "3",
    }
    assert results["modify"].outputs["size"] == "2"  # at its maximum, it goes down
    snapshot = results["backup"].outputs["taken"]
    assert snapshot.startswith(f"{instance}-")
    restore = results["restore"].outputs
    assert restore["snapshot"] == restore["taken"] == snapshot
    assert restore["source"] == instance
    assert restore["target"] == restore["namespace"] != instance


def test_modify_moves_the_first_modifiable_number_to_another_allowed_value():
    spec = load_spec(SPEC.read_text())
    assert spectest.modified_parameters(spec, {"instances": 1}) == {"instances": 2}
    assert spectest.modified_parameters(spec, {"instances": 5}) == {"instances": 4}

    cpu = Parameter(key="cpu", name="cpu", description="", type="Float64", modifiable=True,
                    options=["0.5", "4"])  # fmt: skip
    spec = replace(spec, main=replace(spec.main, parameters=[cpu]))
    assert spectest.modified_parameters(spec, {"cpu": 0.5}) == {"cpu": 4}


def test_a_required_parameter_without_default_fails_create_with_its_name():
    text = PROBE.replace(
        "      - {key: instanceType,",
        "      - {key: owner, type: String, required: true}\n      - {key: instanceType,",
    )

    results = spectest.run(load_spec(text), driver=None)

    assert (results[0].verb, results[0].result) == ("create", "failed")
    assert results[0].error == "parameters: owner: This field is required."
    assert results[-1].result == "not run"


# Argo's forms against the API server: dag.target, withParam from a jqFilter output, and a
# JSON patch whose object is named in flags.
ARGO_FORMS = """
name: Argo forms
x-opsdeck: {kinds: [ConfigMap, Cluster]}
services:
  - name: db
    apiParameters:
      - {key: names, type: String, modifiable: false, defaultValue: "a b"}
    systemWorkflows:
      create:
        outputParameters:
          instances: "$tasks.scale.resource.spec.instances"
          namespace: "$tasks.scale.resource.metadata.namespace"
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 120
          templates:
            - name: main
              dag:
                target: scale each
                tasks:
                  - {name: cluster, template: cluster}
                  - {name: scale, template: scale, dependencies: [cluster]}
                  - {name: list, template: list}
                  - name: each
                    template: each
                    dependencies: [list]
                    withParam: "{{tasks.list.outputs.parameters.names}}"
                    arguments: {parameters: [{name: name, value: "{{item}}"}]}
                  - {name: unneeded, template: unneeded}
            - name: cluster
              resource:
                action: apply
                successCondition: "status.readyInstances == 1"
                manifest: |
                  apiVersion: postgresql.cnpg.io/v1
                  kind: Cluster
                  metadata: {name: "{{ $sys.id }}"}
                  spec: {instances: 1, storage: {size: 1Gi}}
            - name: scale
              resource:
                action: patch
                mergeStrategy: json
                flags: [clusters.postgresql.cnpg.io, "{{ $sys.id }}"]
                successCondition: "status.readyInstances == 2"
                manifest: |
                  - op: replace
                    path: /spec/instances
                    value: 2
            - name: list
              resource:
                action: apply
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: list}
                  data: {names: "{{ $var.names }}"}
              outputs:
                parameters:
                  - name: names
                    valueFrom: {jqFilter: '.data.names | split(" ") | map("cm-" + .)'}
            - name: each
              inputs: {parameters: [{name: name}]}
              resource:
                action: apply
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: "{{inputs.parameters.name}}"}
            - name: unneeded
              resource:
                action: apply
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: unneeded}
      modify:
        workflow:
          entrypoint: get
          activeDeadlineSeconds: 60
          templates:
            - name: get
              resource:
                action: get
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: {name: list}
      delete:
        workflow:
          entrypoint: rm
          activeDeadlineSeconds: 60
          templates:
            - name: rm
              resource:
                action: delete
                manifest: |
                  apiVersion: postgresql.cnpg.io/v1
                  kind: Cluster
                  metadata: {name: "{{ $sys.id }}"}
"""


def test_argo_forms_run_against_the_api_server():
    found: dict[str, set[str]] = {}

    def look(result: spectest.VerbResult) -> None:
        if result.verb == "create":  # the namespace is still there: list its ConfigMaps
            configmaps = driver.dynamic.resources.get(api_version="v1", kind="ConfigMap")
            items = configmaps.get(namespace=result.outputs["namespace"]).to_dict()["items"]
            found["create"] = {item["metadata"]["name"] for item in items}

    with spectest.sandbox_driver(speed=50) as (_, driver):
        results = {r.verb: r for r in spectest.run(load_spec(ARGO_FORMS), driver, on_result=look)}

    assert {r.result for r in results.values()} == {"passed", "skipped"}, results
    assert results["create"].outputs["instances"] == "2"  # the JSON patch reached the Cluster
    assert {"list", "cm-a", "cm-b"} <= found["create"]  # withParam over the jq output
    assert "unneeded" not in found["create"]  # neither a target nor needed by one
