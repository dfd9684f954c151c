"""Loading specs: the two public Omnistrate specs, the workflow model, legacy synthesis."""

import copy
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from deployments.spec import SpecError, load_spec, validate
from deployments.spec.legacy import readiness_expression
from deployments.spec.params import validate_parameters
from deployments.workflow import engine
from deployments.workflow.conditions import parse_condition
from deployments.workflow.outputs import crd_path
from deployments.workflow.render import Context

SPECS = Path(__file__).parent / "specs"
BYOA = (SPECS / "postgres-paas-operator-byoa-spec.yaml").read_text()
EXAMPLE = (SPECS / "examples-cnpg.yaml").read_text()
WORKFLOWS = (SPECS / "postgres-workflows.yaml").read_text()


def healthy_cluster(ready: int = 3) -> dict:
    return {
        "apiVersion": "postgresql.cnpg.io/v1",
        "kind": "Cluster",
        "metadata": {"name": "inst-abcd1234"},
        "status": {
            "phase": "Cluster in healthy state",
            "readyInstances": ready,
            "image": "ghcr.io/cloudnative-pg/postgresql:17",
            "conditions": [
                {"type": "LastBackupSucceeded", "status": "False"},
                {"type": "Ready", "status": "True", "reason": "ClusterIsReady"},
            ],
        },
    }


def cel_holds(condition: str, obj: dict) -> bool:
    """Whether the engine's condition evaluator finds `condition` met by `obj`."""
    return parse_condition(condition).all_match(obj)


# --- the public specs ---------------------------------------------------------------------


def test_byoa_public_spec_loads_with_one_namespace_warning():
    spec = load_spec(BYOA)

    assert spec.key == "postgresql-server"
    assert spec.service == "postgresql-server"
    assert spec.main.name == "CNPG"
    assert set(spec.main.verbs) == {"create", "modify", "delete"}
    assert spec.allowed_kinds == ["Cluster", "Secret"]
    assert spec.warnings == [
        "services[0].operatorCRDConfiguration.supplementalFiles[0]: "
        "metadata.namespace is replaced by the instance's namespace"
    ]


def test_byoa_public_spec_parameters_are_typed():
    spec = load_spec(BYOA)
    by_key = {p.key: p for p in spec.main.parameters}

    assert by_key["numberOfInstances"].default == 1
    assert by_key["numberOfInstances"].limits == {"min": 1}
    assert by_key["postgresqlPassword"].type == "Password"
    assert by_key["postgresqlPassword"].required is True
    assert by_key["postgresqlPassword"].default is None
    assert by_key["storageSize"].default == "20Gi"
    assert by_key["instanceType"].modifiable is True


def test_byoa_public_spec_keeps_unknown_keys():
    spec = load_spec(BYOA)

    assert spec.raw["deployment"]["byoaDeployment"]["AwsAccountId"] == "541226919566"
    assert spec.main.raw["compute"]["instanceTypes"][0]["apiParam"] == "instanceType"
    assert (
        spec.main.endpoints["reader"]["host"] == "reader-{{ $sys.network.externalClusterEndpoint }}"
    )


def test_example_public_spec_loads_with_one_namespace_warning():
    result = validate(EXAMPLE)

    assert result.errors == []
    assert result.warnings == [
        "services[0].operatorCRDConfiguration.template: "
        "metadata.namespace is replaced by the instance's namespace"
    ]
    assert result.spec is not None
    assert result.spec.key == "cloud-native-postgres"
    assert result.spec.main.parameters == []


# --- legacy synthesis ---------------------------------------------------------------------


def test_legacy_create_applies_supplemental_files_then_the_gated_custom_resource():
    create = load_spec(BYOA).main.verbs["create"]
    workflow = create.workflow
    main = workflow.templates[workflow.entrypoint]

    assert [(t.name, t.template, t.dependencies) for t in main.tasks] == [
        ("supplemental-0", "apply-supplemental-0", None),
        ("cr", "apply-cr", ["supplemental-0"]),
    ]
    cr = workflow.templates["apply-cr"].resource
    assert cr.action == "apply"
    assert cr.manifest.startswith("apiVersion: postgresql.cnpg.io/v1\nkind: Cluster\n")
    assert "name: {{ $sys.id }}" in cr.manifest
    secret = workflow.templates["apply-supplemental-0"].resource
    assert "kind: Secret" in secret.manifest
    assert secret.success_condition is None
    assert create.synthesized is True


def test_legacy_modify_is_the_same_gated_apply_and_delete_removes_cr_first():
    spec = load_spec(BYOA)
    modify, delete = spec.main.verbs["modify"].workflow, spec.main.verbs["delete"].workflow

    assert modify.templates["apply-cr"].resource.success_condition == (
        spec.main.verbs["create"].workflow.templates["apply-cr"].resource.success_condition
    )
    tasks = delete.templates[delete.entrypoint].tasks
    assert [(t.name, t.template, t.dependencies) for t in tasks] == [
        ("cr", "delete-cr", None),
        ("supplemental-0", "delete-supplemental-0", ["cr"]),
    ]
    assert all(t.resource.action == "delete" for n, t in delete.templates.items() if t.resource)
    assert delete.templates["delete-cr"].resource.success_condition is None
    assert spec.main.verbs["delete"].outputs == {}


def test_legacy_readiness_becomes_one_cel_condition_that_waits_for_a_healthy_cluster():
    spec = load_spec(EXAMPLE)
    condition = spec.main.verbs["create"].workflow.templates["apply-cr"].resource.success_condition

    assert condition == (
        'cel: string(self.status.phase) == "Cluster in healthy state"'
        ' && string(self.status.readyInstances) == "3"'
        ' && self.status.conditions.exists(e0, string(e0.type) == "Ready"'
        ' && string(e0.status) == "True")'
    )
    assert cel_holds(condition, healthy_cluster(ready=3))
    assert not cel_holds(condition, healthy_cluster(ready=2))
    not_ready = healthy_cluster()
    not_ready["status"]["conditions"][1]["status"] = "False"
    assert not cel_holds(condition, not_ready)
    assert not cel_holds(condition, {"metadata": {"name": "x"}})  # no status yet: keep waiting


@pytest.mark.parametrize(
    ("path", "expected", "obj", "holds"),
    [
        ("$var._crd.status.phase", "Cluster in healthy state", healthy_cluster(), True),
        ("$var._crd.status.readyInstances", 3, healthy_cluster(3), True),
        ("$var._crd.status.readyInstances", "3", healthy_cluster(3), True),
        ("$var._crd.status.conditions[1].reason", "ClusterIsReady", healthy_cluster(), True),
        ("$var._crd.status.conditions[*].type", "Ready", healthy_cluster(), True),
        ("$var._crd.status.conditions[?(@.type=='Ready')].status", True, healthy_cluster(), True),
        ("$var._crd.metadata['name']", "inst-abcd1234", healthy_cluster(), True),
        (
            "$var._crd.status.conditions[?(@.type!='Ready')].status",
            "True",
            healthy_cluster(),
            False,
        ),
    ],
)
def test_legacy_readiness_paths_agree_with_the_jsonpath_they_translate(path, expected, obj, holds):
    assert cel_holds("cel: " + readiness_expression(path, expected), obj) is holds


@pytest.mark.parametrize("phase", ["Prêt", "就緒", "🚀 ready", "\U0001d4e1eady", "就緒𠀋"])
def test_legacy_readiness_matches_text_beyond_plain_ascii(phase):
    """A value or a field name with a character beyond U+FFFF (an emoji, a rare CJK letter)
    never matched: its CEL literal spelled it as a surrogate pair, two characters to CEL."""
    obj = healthy_cluster()
    obj["status"]["phase"] = phase
    obj["status"][phase] = "go"

    assert cel_holds("cel: " + readiness_expression("$var._crd.status.phase", phase), obj)
    assert cel_holds("cel: " + readiness_expression(f"$var._crd.status['{phase}']", "go"), obj)


def test_legacy_readiness_translation_matches_the_engines_crd_path_reading():
    obj, path = healthy_cluster(), '$var._crd.status.conditions[?(@.type=="Ready")].status'

    assert crd_path(obj, path) == "True"
    assert cel_holds("cel: " + readiness_expression(path, "True"), obj)


def test_legacy_output_that_selects_from_a_list_is_an_error():
    document = yaml.safe_load(EXAMPLE)
    outputs = document["services"][0]["operatorCRDConfiguration"]["outputParameters"]
    outputs["Ready"] = '$var._crd.status.conditions[?(@.type=="Ready")].status'

    assert validate(yaml.safe_dump(document, sort_keys=False)).errors == [
        'services[0].operatorCRDConfiguration.outputParameters["Ready"]: output '
        '"$var._crd.status.conditions[?(@.type=="Ready")].status" cannot select from a list; '
        "use a dotted path"
    ]


def test_legacy_outputs_read_the_custom_resource_task():
    create = load_spec(EXAMPLE).main.verbs["create"]

    assert create.outputs == {
        "Postgres Container Image": "$tasks.cr.resource.status.image",
        "Status": "$tasks.cr.resource.status.phase",
        "Topology": "$tasks.cr.resource.status.topology",
    }


def test_legacy_verbs_get_platform_deadlines_without_warnings():
    spec = load_spec(EXAMPLE, deadlines={"modify": 600})

    assert spec.main.verbs["create"].workflow.active_deadline_seconds == 3600
    assert spec.main.verbs["modify"].workflow.active_deadline_seconds == 600
    assert spec.main.verbs["delete"].workflow.active_deadline_seconds == 1800
    assert not any("activeDeadlineSeconds" in w for w in spec.warnings)


def test_system_workflows_take_precedence_over_a_legacy_template():
    document = yaml.safe_load(WORKFLOWS)
    document["services"][0]["operatorCRDConfiguration"] = yaml.safe_load(EXAMPLE)["services"][0][
        "operatorCRDConfiguration"
    ]
    result = validate(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))

    assert result.errors == []
    assert result.warnings[0] == (
        "services[0].operatorCRDConfiguration.template: "
        "unused: systemWorkflows define create, modify and delete"
    )
    assert result.spec.main.verbs["create"].synthesized is False


# --- the workflow model -------------------------------------------------------------------


def test_workflow_spec_loads_plan_identity_and_extensions():
    spec = load_spec(WORKFLOWS)

    assert (spec.key, spec.name, spec.service) == (
        "postgres-production",
        "PostgreSQL — Production",
        "postgresql",
    )
    assert spec.description == "Highly available PostgreSQL on CloudNativePG."
    assert spec.allowed_kinds == ["Cluster", "Backup", "Secret"]
    assert spec.usage_rules["cpu"] == "double(var.cpu) * double(var.instances)"
    assert spec.parameter_groups == [{"name": "Compute", "parameters": ["cpu", "instances"]}]
    assert spec.max_instances == 5
    assert [p["price"] for p in spec.pricing] == [Decimal("0.04"), Decimal("0.0002")]
    assert spec.warnings == []


def test_workflow_spec_builds_every_verb_with_its_templates():
    spec = load_spec(WORKFLOWS)
    verbs = spec.main.verbs

    assert list(verbs) == [
        "create",
        "modify",
        "delete",
        "backup",
        "restore",
        "deleteBackup",
        "restartServer",
    ]
    create = verbs["create"].workflow
    assert create.entrypoint == "main"
    assert create.arguments == {"ns": "{{ $sys.namespace }}"}
    assert create.active_deadline_seconds == 1800
    cluster = create.templates["apply-cluster"]
    assert cluster.resource.failure_condition == "status.phase == Failed"
    assert cluster.retry.limit == 2
    assert (cluster.retry.policy, cluster.retry.duration, cluster.retry.cap) == ("OnError", 10, 60)
    assert cluster.outputs[0].json_path == "{.status.phase}"
    assert verbs["create"].outputs == {"image": "$tasks.cluster.resource.status.image"}
    task = verbs["backup"].workflow.templates["main"].tasks[1]
    assert (task.depends, task.when) == (
        "take.Succeeded",
        "{{tasks.take.outputs.parameters.phase}} == completed",
    )
    assert spec.main.backup["snapshotBeforeDeletion"] is True


def test_custom_workflow_becomes_a_custom_verb_with_its_own_parameters():
    verb = load_spec(WORKFLOWS).main.verbs["restartServer"]

    assert verb.custom is True
    assert (verb.display_name, verb.scope) == ("Restart", ["END_CUSTOMER"])
    assert [p.key for p in verb.parameters] == ["reason"]


def test_plan_key_defaults_to_the_slug_of_the_name_and_service_to_the_key():
    document = yaml.safe_load(WORKFLOWS)
    del document["x-opsdeck"]["plan"], document["x-opsdeck"]["service"]
    spec = load_spec(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))

    assert (spec.key, spec.service) == ("postgresql-production", "postgresql-production")


def test_unknown_keys_are_kept_and_never_fatal():
    document = yaml.safe_load(WORKFLOWS)
    document["somethingNew"] = {"a": 1}
    spec = load_spec(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))

    assert spec.raw["somethingNew"] == {"a": 1}
    assert spec.main.raw["futureKey"] == "kept as is"


def test_malformed_yaml_is_one_error_with_line_and_column():
    with pytest.raises(SpecError) as caught:
        load_spec("name: x\nservices:\n  - name: [unclosed\n")

    assert len(caught.value.errors) == 1
    assert caught.value.errors[0].startswith("The spec is not valid YAML at line 4, column 1:")
    assert str(caught.value) == caught.value.errors[0]


def test_spec_error_lists_every_error_joined_by_newlines():
    document = yaml.safe_load(WORKFLOWS)
    workflows = document["services"][0]["systemWorkflows"]
    del workflows["modify"], workflows["delete"]

    with pytest.raises(SpecError) as caught:
        load_spec(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))

    assert caught.value.errors == [
        'services[0].systemWorkflows: missing required verb "modify"',
        'services[0].systemWorkflows: missing required verb "delete"',
    ]
    assert str(caught.value) == "\n".join(caught.value.errors)


def test_a_spec_that_is_not_a_mapping_is_refused():
    assert validate("- just\n- a list\n").errors == [
        "The spec must be a YAML mapping with name and services"
    ]


def test_legacy_outputs_without_readiness_still_capture_the_custom_resource():
    document = yaml.safe_load(EXAMPLE)
    del document["services"][0]["operatorCRDConfiguration"]["readinessConditions"]
    spec = load_spec(yaml.safe_dump(document, sort_keys=False))
    cr = spec.main.verbs["create"].workflow.templates["apply-cr"].resource

    assert cr.success_condition == "cel: true"
    assert cel_holds(cr.success_condition, {"status": {}})


def test_legacy_without_outputs_or_readiness_applies_without_waiting():
    document = yaml.safe_load(EXAMPLE)
    crd = document["services"][0]["operatorCRDConfiguration"]
    del crd["readinessConditions"], crd["outputParameters"]
    spec = load_spec(yaml.safe_dump(document, sort_keys=False))

    assert (
        spec.main.verbs["create"].workflow.templates["apply-cr"].resource.success_condition is None
    )


# --- the synthesized verbs run on the engine ---------------------------------------------

NS = "inst-abcd1234"


class Cluster:
    """The driver protocol over a dict of objects by (kind, name): enough to run a verb."""

    def __init__(self):
        self.objects: dict[tuple[str, str], dict] = {}

    def _key(self, obj: dict) -> tuple[str, str]:
        return obj["kind"], obj["metadata"]["name"]

    def create(self, obj, *, owner_label):
        return self.objects.setdefault(self._key(obj), copy.deepcopy(obj))

    def apply(self, obj):
        status = self.objects.get(self._key(obj), {}).get("status")
        self.objects[self._key(obj)] = copy.deepcopy(obj)
        if status is not None:
            self.objects[self._key(obj)]["status"] = status
        return self.objects[self._key(obj)]

    def patch(self, obj, *, strategy, subresource):
        return self.apply(obj)

    def replace(self, obj):
        return self.apply(obj)

    def delete(self, obj):
        self.objects.pop(self._key(obj), None)

    def get(self, obj):
        found = self.objects.get(self._key(obj))
        return copy.deepcopy(found) if found is not None else None


def run(spec, verb: str, cluster: Cluster, values: dict, *, until: float = 60) -> engine.RunState:
    """Advance `verb` every 5 s (as Argo polls) until it is done or `until` seconds pass;
    the CNPG operator is played by `cluster`'s test."""
    workflow = spec.main.verbs[verb].workflow
    ctx = Context(
        var=validate_parameters(spec.main.parameters, values),
        sys={
            "id": NS,
            "namespace": NS,
            "deploymentCell": {"region": "eu-west-1", "publicSubnetIDs": [{"id": "subnet-1"}]},
            "compute": {"node": {"instanceType": "t3.medium"}},
            "deployment": {"resourceID": "r-1"},
            "network": {"externalClusterEndpoint": "db.example.com"},
        },
    )
    settings = engine.RunSettings(namespace=NS, allowed_kinds=spec.allowed_kinds)
    state = engine.start(workflow, operation_id=f"op-{verb}", now=0)
    now = 0.0
    while not state.done and now <= until:
        engine.advance(state, workflow, ctx, cluster, settings, now=now)
        now += 5
    return state


def test_byoa_legacy_create_waits_for_readiness_and_reads_its_outputs():
    spec, cluster = load_spec(BYOA), Cluster()

    waiting = run(spec, "create", cluster, {"numberOfInstances": "2"}, until=20)
    assert not waiting.done
    created = cluster.objects[("Cluster", NS)]
    assert created["spec"]["instances"] == 2
    assert created["spec"]["storage"]["size"] == "20Gi"
    assert cluster.objects[("Secret", "basic-auth")]["metadata"]["namespace"] == NS

    created["status"] = healthy_cluster()["status"]
    state = run(spec, "create", cluster, {"numberOfInstances": "2"})
    assert (state.done, state.phase) == (True, "Succeeded")
    assert engine.verb_outputs(state, spec.main.verbs["create"].outputs) == {
        "Postgres Container Image": "ghcr.io/cloudnative-pg/postgresql:17",
        "Status": "Cluster in healthy state",
        "Topology": "",
    }


def test_example_legacy_create_then_delete_leaves_nothing_behind():
    spec, cluster = load_spec(EXAMPLE), Cluster()
    cluster.objects[("Cluster", "cluster-example")] = {"status": healthy_cluster(3)["status"]}

    assert run(spec, "create", cluster, {}).phase == "Succeeded"
    assert cluster.objects[("Cluster", "cluster-example")]["metadata"]["namespace"] == NS
    assert run(spec, "delete", cluster, {}).phase == "Succeeded"
    assert cluster.objects == {}
