"""Every validation rule: one test each, starting from a valid spec and breaking one thing."""

import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from deployments.spec import params, validate

SPECS = Path(__file__).parent / "specs"
WORKFLOWS = (SPECS / "postgres-workflows.yaml").read_text()
EXAMPLE = (SPECS / "examples-cnpg.yaml").read_text()

CREATE = "services[0].systemWorkflows.create.workflow"
BACKUP = "services[0].systemWorkflows.backup.workflow"
PARAMS = "services[0].apiParameters"


def check(change: Callable[[dict], None], base: str = WORKFLOWS):
    """Validate the base spec after `change` mutated its parsed document."""
    document = yaml.safe_load(base)
    change(document)
    return validate(yaml.safe_dump(document, sort_keys=False, allow_unicode=True))


def check_stored(change: Callable[[dict], None], base: str = WORKFLOWS):
    """`check`, as a plan version stored already is read."""
    document = yaml.safe_load(base)
    change(document)
    return validate(yaml.safe_dump(document, sort_keys=False, allow_unicode=True), stored=True)


def errors(change: Callable[[dict], None], base: str = WORKFLOWS) -> list[str]:
    return check(change, base).errors


def service(document: dict) -> dict:
    return document["services"][0]


def workflow(document: dict, verb: str) -> dict:
    return service(document)["systemWorkflows"][verb]["workflow"]


def templates(document: dict, verb: str = "create") -> list[dict]:
    return workflow(document, verb)["templates"]


def tasks(document: dict, verb: str = "create") -> list[dict]:
    return templates(document, verb)[0]["dag"]["tasks"]


def parameter(document: dict, key: str) -> dict:
    return next(p for p in service(document)["apiParameters"] if p["key"] == key)


def test_the_base_spec_is_valid():
    result = validate(WORKFLOWS)

    assert (result.errors, result.warnings) == ([], [])


def test_a_spec_with_errors_gives_no_spec_object():
    result = check(lambda d: service(d)["systemWorkflows"].pop("delete"))

    assert result.spec is None
    assert result.errors


# --- verbs --------------------------------------------------------------------------------


def test_missing_required_verb():
    assert errors(lambda d: service(d)["systemWorkflows"].pop("modify")) == [
        'services[0].systemWorkflows: missing required verb "modify"'
    ]


def test_backup_configuration_requires_backup_restore_and_delete_backup():
    def drop(document):
        service(document)["systemWorkflows"].pop("restore")
        service(document)["systemWorkflows"].pop("deleteBackup")

    assert errors(drop) == [
        'services[0].systemWorkflows: missing required verb "restore" '
        "(capabilities.backupConfiguration is set)",
        'services[0].systemWorkflows: missing required verb "deleteBackup" '
        "(capabilities.backupConfiguration is set)",
    ]


def test_unknown_verb_is_a_warning_not_an_error():
    result = check(
        lambda d: service(d)["systemWorkflows"].update(
            scale=service(d)["systemWorkflows"]["modify"]
        )
    )

    assert result.errors == []
    assert result.warnings[0].startswith(
        'services[0].systemWorkflows.scale: unknown verb "scale" is ignored; known verbs: create,'
    )


def test_custom_verb_cannot_reuse_a_system_verb_name():
    def clash(document):
        service(document)["customWorkflows"][0]["verb"] = "restart"

    assert errors(clash) == [
        'services[0].customWorkflows[0].verb: verb "restart" is already defined'
    ]


def test_custom_verb_scope_must_be_fleet_or_end_customer():
    def scope(document):
        service(document)["customWorkflows"][0]["scope"] = ["everyone"]

    assert errors(scope) == [
        'services[0].customWorkflows[0].scope: unknown scope "everyone"; '
        "expected fleet or END_CUSTOMER"
    ]


def test_no_service_carrying_the_operator_is_an_error():
    def two_plain_services(document):
        del service(document)["operatorCRDConfiguration"]
        del service(document)["systemWorkflows"]
        document["services"].append({"name": "other"})

    assert errors(two_plain_services) == ["services: no service carries operatorCRDConfiguration"]


# --- templates and tasks ------------------------------------------------------------------


def test_unknown_entrypoint():
    assert errors(lambda d: workflow(d, "create").update(entrypoint="start")) == [
        f'{CREATE}.entrypoint: unknown template "start"; '
        "templates: main, apply-secret, apply-cluster"
    ]


def test_unknown_on_exit_template():
    assert errors(lambda d: workflow(d, "create").update(onExit="cleanup")) == [
        f'{CREATE}.onExit: unknown template "cleanup"; templates: main, apply-secret, apply-cluster'
    ]


def test_unknown_task_template():
    assert errors(lambda d: tasks(d)[1].update(template="apply-clustre")) == [
        f'{CREATE}.templates[0].dag.tasks[1].template: unknown template "apply-clustre"; '
        "templates: main, apply-secret, apply-cluster"
    ]


@pytest.mark.parametrize("name", ["PostgreSQL\nBcc: x@example.com", "Postgre\tSQL"])
def test_a_plan_name_is_one_line_of_text(name):
    """The plan's name is in page titles and email subjects: a line break in it made every
    email naming the plan one no attempt could send."""
    assert errors(lambda d: d.update(name=name)) == [
        "name: must be one line of text, without tabs or control characters"
    ]


def test_duplicate_template_name():
    assert errors(lambda d: templates(d)[2].update(name="apply-secret")) == [
        f'{CREATE}.templates[2].name: duplicate template "apply-secret"',
        f'{CREATE}.templates[0].dag.tasks[1].template: unknown template "apply-cluster"; '
        "templates: main, apply-secret",
    ]


def test_duplicate_task_name():
    assert errors(lambda d: tasks(d)[1].update(name="secret", dependencies=[])) == [
        f'{CREATE}.templates[0].dag.tasks[1].name: duplicate task "secret"',
        # and the verb output now reads a task that no longer exists
        'services[0].systemWorkflows.create.outputParameters.image: no task "cluster" '
        "in this workflow",
    ]


def test_template_with_neither_dag_nor_resource():
    assert errors(lambda d: templates(d)[1].pop("resource")) == [
        f'{CREATE}.templates[1]: template "apply-secret" has neither a dag nor a resource'
    ]


def test_argo_template_types_other_than_dag_and_resource_are_not_supported():
    def container(document):
        templates(document)[1].pop("resource")
        templates(document)[1]["container"] = {"image": "busybox"}

    assert errors(container) == [
        f'{CREATE}.templates[1]: template "apply-secret" has neither a dag nor a resource; '
        "container templates are not supported"
    ]


def test_unknown_dependency():
    assert errors(lambda d: tasks(d)[1].update(dependencies=["secrets"])) == [
        f'{CREATE}.templates[0].dag.tasks[1].dependencies: unknown task "secrets"'
    ]


def test_depends_naming_an_unknown_task():
    assert errors(lambda d: tasks(d, "backup")[1].update(depends="taken.Succeeded")) == [
        f'{BACKUP}.templates[0].dag.tasks[1].depends: unknown task "taken"'
    ]


def test_unparseable_depends():
    found = errors(lambda d: tasks(d, "backup")[1].update(depends="take.Succeeded &&"))

    assert len(found) == 1
    assert found[0].startswith(f"{BACKUP}.templates[0].dag.tasks[1].depends: ")


def test_dependencies_and_depends_cannot_be_mixed():
    assert errors(lambda d: tasks(d, "backup")[0].update(dependencies=[])) == [
        f"{BACKUP}.templates[0].dag: dependencies and depends cannot be mixed in one dag"
    ]


def test_dependency_cycle():
    assert errors(lambda d: tasks(d)[0].update(dependencies=["cluster"])) == [
        f"{CREATE}.templates[0].dag.tasks: dependency cycle: secret -> cluster -> secret"
    ]


@pytest.mark.parametrize("name", ["wait.db", "create secret", "-secret"])
def test_a_task_name_a_dependency_could_not_name_is_refused(name):
    """Such a name loaded, and every run of the verb then failed to read the dependency on it
    (`secret.db.Succeeded` reads as a result "db" of task "secret")."""

    def rename(document):
        tasks(document)[0]["name"] = name
        tasks(document)[1]["dependencies"] = [name]

    found = errors(rename)

    assert found[0].startswith(f'{CREATE}.templates[0].dag.tasks[0].name: "{name}": a task name')


def test_a_task_reading_a_task_it_does_not_depend_on_is_refused():
    """Argo reads a task's outputs only in the tasks that depend on it: a sibling that may run
    first read nothing, and the spec loaded while every create failed (or not, by timing)."""

    def unordered(document):
        tasks(document, "backup")[1].pop("depends")  # it no longer waits for the backup

    assert errors(unordered) == [
        f"{BACKUP}.templates[0].dag.tasks[1].when: undefined reference "
        'tasks.take.outputs.parameters.phase: this task does not depend on "take" (through its '
        "dependencies or theirs), so it may run first; add it to the dependencies"
    ]


def test_a_task_reads_the_tasks_its_dependencies_depend_on():
    def chained(document):
        backup = tasks(document, "backup")
        backup.append({"name": "after", "template": "label", "depends": "announce",
                       "when": "{{tasks.take.outputs.parameters.phase}} == completed"})  # fmt: skip

    assert errors(chained) == []


def test_unknown_dag_target():
    assert errors(lambda d: templates(d)[0]["dag"].update(target="cluster clutser")) == [
        f'{CREATE}.templates[0].dag.target: unknown task "clutser"'
    ]


def test_a_dag_target_named_by_a_parameter_is_checked_as_a_reference():
    def target(text):
        return lambda d: templates(d)[0]["dag"].update(target=text)

    assert errors(target("{{ inputs.parameters.ns }}")) == []
    assert errors(target("{{ inputs.parameters.x }}")) == [
        f"{CREATE}.templates[0].dag.target: undefined reference inputs.parameters.x: "
        'template "main" declares no input "x" (parameters are threaded explicitly at every hop)'
    ]


def test_with_items_and_with_param_cannot_be_mixed():
    assert errors(lambda d: tasks(d)[0].update(withItems=["a"], withParam="[]")) == [
        f"{CREATE}.templates[0].dag.tasks[0]: a task takes withItems or withParam, not both"
    ]


def test_with_param_references_are_checked():
    found = errors(lambda d: tasks(d)[1].update(withParam="{{tasks.nope.outputs.parameters.x}}"))

    assert len(found) == 1
    assert found[0].startswith(f"{CREATE}.templates[0].dag.tasks[1].withParam: undefined ")


def json_patch(document: dict, **resource) -> None:
    templates(document)[1]["resource"] = {  # the Secret's template
        "action": "patch",
        "mergeStrategy": "json",
        "manifest": [{"op": "replace", "path": "/spec/instances", "value": 2}],
        **resource,
    }


def test_a_json_patch_list_names_its_object_in_flags():
    assert errors(lambda d: json_patch(d, flags=["cluster", "{{ $sys.id }}"])) == []
    assert errors(lambda d: json_patch(d, flags=["clusters.postgresql.cnpg.io/pg"])) == []
    assert errors(lambda d: json_patch(d, flags=["--subresource=status"])) == [
        f"{CREATE}.templates[1].resource.flags: a JSON patch given as a list names its "
        'object in flags, e.g. ["cluster", "NAME"] or ["cluster/NAME"]'
    ]


def test_a_list_manifest_is_a_json_patch_only():
    found = errors(lambda d: json_patch(d, flags=["cluster", "x"], mergeStrategy="merge"))

    assert found == [
        f"{CREATE}.templates[1].resource.mergeStrategy: a manifest that is a list is a "
        "JSON patch; set mergeStrategy to json"
    ]


def test_json_patch_operations_need_op_and_path():
    found = errors(lambda d: json_patch(d, flags=["cluster", "x"], manifest=[{"op": "remove"}]))

    assert found == [
        f"{CREATE}.templates[1].resource.manifest[0]: a JSON patch operation is a mapping "
        "with op and path"
    ]


def test_a_jq_filter_may_read_only_the_object():
    def output(document):
        templates(document)[2]["outputs"]["parameters"][0]["valueFrom"] = {"jqFilter": "env.HOME"}

    assert errors(output) == [
        f"{CREATE}.templates[2].outputs.parameters[0].valueFrom.jqFilter: jq: env is not "
        "allowed; a filter reads the object only"
    ]


def test_a_json_patch_list_with_a_stray_separator_or_no_operations():
    stray = "- {op: replace, path: /spec/instances, value: 2}\n---\n"
    assert errors(lambda d: json_patch(d, flags=["cluster", "x"], manifest=stray)) == []
    assert errors(lambda d: json_patch(d, flags=["cluster", "x"], manifest=[])) == [
        f"{CREATE}.templates[1].resource.manifest: a JSON patch needs at least one operation"
    ]


def test_an_invalid_jq_filter_is_refused_at_load():
    def output(document):
        templates(document)[2]["outputs"]["parameters"][0]["valueFrom"] = {"jqFilter": ".["}

    found = errors(output)
    assert len(found) == 1
    assert found[0].startswith(
        f"{CREATE}.templates[2].outputs.parameters[0].valueFrom.jqFilter: jq: syntax error"
    )


def test_unparseable_when_expression():
    found = errors(lambda d: tasks(d, "backup")[1].update(when="(a == b"))

    assert len(found) == 1
    assert found[0].startswith(f"{BACKUP}.templates[0].dag.tasks[1].when: ")


# --- references ---------------------------------------------------------------------------


def test_undefined_parameter_reference():
    def typo(document):
        resource = templates(document)[2]["resource"]
        resource["manifest"] = resource["manifest"].replace("$var.instances", "$var.instance")

    assert errors(typo) == [
        f"{CREATE}.templates[2].resource.manifest: undefined parameter reference "
        '$var.instance; no apiParameter has key "instance"'
    ]


def test_custom_verb_may_read_its_own_parameters_but_system_verbs_may_not():
    def read_reason(document):
        resource = templates(document, "modify")[0]["resource"]
        resource["manifest"] += "  annotations:\n    why: '{{ $var.reason }}'\n"

    assert errors(read_reason) == [
        "services[0].systemWorkflows.modify.workflow.templates[0].resource.manifest: "
        'undefined parameter reference $var.reason; no apiParameter has key "reason"'
    ]


def test_undefined_input_reference():
    def unthreaded(document):
        resource = templates(document)[2]["resource"]
        resource["manifest"] += "  namespace2: '{{inputs.parameters.ns}}'\n"

    assert errors(unthreaded) == [
        f"{CREATE}.templates[2].resource.manifest: undefined reference inputs.parameters.ns: "
        'template "apply-cluster" declares no input "ns" '
        "(parameters are threaded explicitly at every hop)"
    ]


def test_input_not_passed_by_the_calling_task():
    assert errors(lambda d: tasks(d)[0].pop("arguments")) == [
        f'{CREATE}.templates[0].dag.tasks[0].arguments: input "ns" of template "apply-secret" '
        "is not passed (parameters are threaded explicitly at every hop)"
    ]


def test_entrypoint_input_not_passed_by_the_workflow_arguments():
    assert errors(lambda d: workflow(d, "create").pop("arguments")) == [
        f'{CREATE}.arguments.parameters: input "ns" of template "main" is not passed '
        "(parameters are threaded explicitly at every hop)"
    ]


def test_argument_for_an_undeclared_input_is_a_warning():
    def extra(document):
        tasks(document)[1]["arguments"] = {"parameters": [{"name": "size", "value": "1"}]}

    result = check(extra)
    assert result.errors == []
    assert result.warnings == [
        f"{CREATE}.templates[0].dag.tasks[1].arguments.parameters.size: "
        'template "apply-cluster" declares no input "size"; the value is unused'
    ]


def test_undefined_workflow_parameter_reference():
    def read(document):
        tasks(document)[0]["arguments"]["parameters"][0]["value"] = "{{workflow.parameters.nz}}"

    assert errors(read) == [
        f"{CREATE}.templates[0].dag.tasks[0].arguments.parameters.ns: undefined reference "
        'workflow.parameters.nz: the workflow\'s arguments have no parameter "nz"'
    ]


def test_task_output_reference_to_an_unknown_task():
    assert errors(
        lambda d: tasks(d, "backup")[1].update(
            when="{{tasks.tak.outputs.parameters.phase}} == completed"
        )
    ) == [
        f"{BACKUP}.templates[0].dag.tasks[1].when: undefined reference "
        'tasks.tak.outputs.parameters.phase: no task "tak" in this dag'
    ]


def test_task_output_reference_to_an_undeclared_output():
    assert errors(
        lambda d: tasks(d, "backup")[1].update(
            when="{{tasks.take.outputs.parameters.state}} == completed"
        )
    ) == [
        f"{BACKUP}.templates[0].dag.tasks[1].when: undefined reference "
        'tasks.take.outputs.parameters.state: template "take-backup" has no output "state"'
    ]


def test_task_output_reference_outside_a_dag():
    def read(document):
        resource = templates(document, "backup")[2]["resource"]
        resource["manifest"] += "  annotations:\n    p: '{{tasks.take.outputs.parameters.phase}}'\n"

    assert errors(read) == [
        f"{BACKUP}.templates[2].resource.manifest: undefined reference "
        "tasks.take.outputs.parameters.phase: tasks can only be read in a dag's tasks"
    ]


def test_unknown_system_variable():
    def typo(document):
        resource = templates(document)[2]["resource"]
        resource["manifest"] = resource["manifest"].replace("$sys.id", "$sys.ident")

    assert errors(typo) == [
        f"{CREATE}.templates[2].resource.manifest: unknown system variable $sys.ident"
    ]


def test_malformed_placeholder():
    def broken(document):
        resource = templates(document)[2]["resource"]
        resource["manifest"] = resource["manifest"].replace("{{ $var.database }}", "{{ $var. }}")

    found = errors(broken)
    assert len(found) == 1
    assert found[0].startswith(f"{CREATE}.templates[2].resource.manifest: ")


# --- resources and conditions -------------------------------------------------------------


def test_condition_with_a_value_that_is_not_a_label_value():
    def spaced(document):
        templates(document, "backup")[2]["resource"]["successCondition"] = (
            "status.phase == Cluster in healthy state"
        )

    assert errors(spaced) == [
        f'{BACKUP}.templates[2].resource.successCondition: value "Cluster in healthy state" '
        "is not a valid label value; use a cel: condition"
    ]


def test_unparseable_cel_condition_is_one_line():
    def broken(document):
        templates(document)[2]["resource"]["successCondition"] = "cel: self.status.phase =="

    found = errors(broken)
    assert len(found) == 1
    assert found[0].startswith(f"{CREATE}.templates[2].resource.successCondition: ")
    assert "\n" not in found[0]


def test_condition_with_a_placeholder_is_checked_after_substitution():
    def templated(document):
        templates(document)[2]["resource"]["successCondition"] = (
            "status.readyInstances == {{ $var.instances }}"
        )

    assert errors(templated) == []


def test_unparseable_failure_condition():
    def broken(document):
        templates(document)[2]["resource"]["failureCondition"] = "status.phase == =="

    found = errors(broken)
    assert len(found) == 1
    assert found[0].startswith(f"{CREATE}.templates[2].resource.failureCondition: ")


def test_delete_takes_no_conditions():
    def gated(document):
        templates(document, "delete")[0]["resource"]["successCondition"] = "status.phase == x"

    assert errors(gated) == [
        "services[0].systemWorkflows.delete.workflow.templates[0].resource.successCondition: "
        "a delete takes no conditions"
    ]


def test_unknown_resource_action():
    assert errors(lambda d: templates(d)[1]["resource"].update(action="upsert")) == [
        f'{CREATE}.templates[1].resource.action: unknown action "upsert"; '
        "expected one of get, create, apply, delete, replace, patch"
    ]


def test_strategic_merge_patch_of_a_custom_resource():
    assert errors(lambda d: templates(d, "modify")[0]["resource"].pop("mergeStrategy")) == [
        "services[0].systemWorkflows.modify.workflow.templates[0].resource.mergeStrategy: "
        "a strategic merge patch is not supported for custom resources (Cluster of "
        "postgresql.cnpg.io/v1); set mergeStrategy to merge or json"
    ]


def test_multi_document_manifest():
    def two(document):
        resource = templates(document)[1]["resource"]
        resource["manifest"] += "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: other\n"

    assert errors(two) == [
        f"{CREATE}.templates[1].resource.manifest: the manifest holds 2 documents; a resource "
        "template applies exactly one Kubernetes object (use one template per object)"
    ]


def test_manifest_that_is_not_yaml():
    def broken(document):
        templates(document)[1]["resource"]["manifest"] = "kind: Secret\n  name: [x\n"

    found = errors(broken)
    assert len(found) == 1
    assert found[0].startswith(
        f"{CREATE}.templates[1].resource.manifest: the manifest is not valid YAML at line 2"
    )


def test_manifest_without_kind_or_name():
    def bare(document):
        templates(document)[1]["resource"]["manifest"] = "apiVersion: v1\nmetadata: {}\n"

    assert errors(bare) == [
        f"{CREATE}.templates[1].resource.manifest: the object has no kind",
        f"{CREATE}.templates[1].resource.manifest: the object has no metadata.name",
    ]


def test_kind_not_declared_in_x_opsdeck():
    def other_kind(document):
        resource = templates(document)[1]["resource"]
        resource["manifest"] = resource["manifest"].replace("kind: Secret", "kind: ConfigMap")

    assert errors(other_kind) == [
        f'{CREATE}.templates[1].resource.manifest: kind "ConfigMap" is not in x-opsdeck.kinds '
        "(Cluster, Backup, Secret)"
    ]


def test_kinds_may_be_declared_with_their_api_version():
    def qualified(document):
        document["x-opsdeck"]["kinds"] = ["postgresql.cnpg.io/v1/Cluster", "Backup", "v1/Secret"]

    assert errors(qualified) == []


def test_invalid_output_json_path():
    def broken(document):
        templates(document)[2]["outputs"]["parameters"][0]["valueFrom"]["jsonPath"] = "{.status[}"

    found = errors(broken)
    assert len(found) == 1
    assert found[0].startswith(f"{CREATE}.templates[2].outputs.parameters[0].valueFrom.jsonPath: ")


def test_verb_output_reading_a_task_without_success_condition():
    def ungated(document):
        service(document)["systemWorkflows"]["create"]["outputParameters"] = {
            "secret": "$tasks.secret.resource.metadata.name"
        }

    assert errors(ungated) == [
        'services[0].systemWorkflows.create.outputParameters.secret: task "secret" has no '
        "successCondition, so it captures no object to read"
    ]


def test_verb_output_reading_an_unknown_task():
    def unknown(document):
        service(document)["systemWorkflows"]["create"]["outputParameters"] = {
            "image": "$tasks.clustr.resource.status.image"
        }

    assert errors(unknown) == [
        'services[0].systemWorkflows.create.outputParameters.image: no task "clustr" '
        "in this workflow"
    ]


# --- parameters ---------------------------------------------------------------------------


def test_default_outside_its_limits():
    assert errors(lambda d: parameter(d, "instances").update(defaultValue="9")) == [
        f'{PARAMS}[0].defaultValue: default "9" is invalid: Must be between 1 and 5.'
    ]


def test_default_not_matching_its_regex():
    assert errors(lambda d: parameter(d, "database").update(defaultValue="App")) == [
        f'{PARAMS}[3].defaultValue: default "App" is invalid: Must match the pattern '
        "^[a-z][a-z0-9_]*$."
    ]


def test_default_not_among_its_options():
    assert errors(lambda d: parameter(d, "cpu").update(defaultValue="3")) == [
        f'{PARAMS}[1].defaultValue: default "3" is invalid: Must be one of: 1, 2, 4.'
    ]


def test_default_of_the_wrong_type():
    assert errors(lambda d: parameter(d, "superuser").update(defaultValue="maybe")) == [
        f'{PARAMS}[5].defaultValue: default "maybe" is invalid: Must be true or false.'
    ]


def test_limits_with_min_above_max():
    assert errors(lambda d: parameter(d, "instances").update(limits={"min": 5, "max": 1})) == [
        f"{PARAMS}[0].limits: min (5) is greater than max (1)",
        f'{PARAMS}[0].defaultValue: default "1" is invalid: Must be between 5 and 1.',
    ]


def test_invalid_regex():
    found = errors(lambda d: parameter(d, "database").update(regex="^[a-z"))

    assert len(found) == 1
    assert found[0].startswith(f"{PARAMS}[3].regex: is not a valid regular expression")


def test_a_regex_go_cannot_compile_is_refused_with_its_reason():
    # Omnistrate reads patterns as Go does (RE2): no backreferences, no lookarounds.
    assert errors(lambda d: parameter(d, "database").update(regex=r"^(a)\1$")) == [
        f"{PARAMS}[3].regex: is not a valid regular expression (invalid escape sequence: \\1)"
    ]
    assert errors(lambda d: parameter(d, "database").update(regex="^(?!admin)[a-z]+$")) == [
        f"{PARAMS}[3].regex: is not a valid regular expression (invalid perl operator: (?!)"
    ]


def test_optional_parameter_without_default():
    assert errors(lambda d: parameter(d, "storageGi").pop("defaultValue")) == [
        f'{PARAMS}[2]: optional parameter "storageGi" needs a defaultValue'
    ]


def test_unknown_parameter_type():
    assert errors(lambda d: parameter(d, "storageGi").update(type="Integer")) == [
        f'{PARAMS}[2].type: unknown type "Integer"; '
        "expected one of String, Float64, Boolean, Password, JSON"
    ]


def test_duplicate_parameter_key():
    assert errors(lambda d: parameter(d, "cpu").update(key="instances")) == [
        f'{PARAMS}[1].key: duplicate parameter key "instances"',
        # the usage rule and the display group still name the old key
        'x-opsdeck.usage.cpu: undefined parameter reference var.cpu; no apiParameter "cpu"',
        'x-opsdeck.display.groups[0].parameters: unknown parameter "cpu"',
    ]


def test_modifiable_parameter_feeding_metadata_name():
    def rename(document):
        resource = templates(document, "modify")[0]["resource"]
        resource["manifest"] = resource["manifest"].replace("{{ $sys.id }}", "{{ $var.cpu }}-pg")

    assert errors(rename) == [
        "services[0].systemWorkflows.modify.workflow.templates[0].resource.manifest: "
        'metadata.name uses parameter "cpu", which is modifiable; a parameter that feeds '
        "metadata.name must be modifiable: false"
    ]


def test_modifiable_parameter_feeding_metadata_name_through_threaded_inputs():
    def thread(document):
        workflow(document, "create")["arguments"]["parameters"][0]["value"] = "{{ $var.cpu }}"
        resource = templates(document)[1]["resource"]
        resource["manifest"] = resource["manifest"].replace(
            "{{ $sys.id }}-app", "{{inputs.parameters.ns}}-app"
        )

    assert errors(thread) == [
        f'{CREATE}.templates[1].resource.manifest: metadata.name uses parameter "cpu", '
        "which is modifiable; a parameter that feeds metadata.name must be modifiable: false"
    ]


def test_non_modifiable_parameter_may_feed_metadata_name():
    def rename(document):
        resource = templates(document, "modify")[0]["resource"]
        resource["manifest"] = resource["manifest"].replace("{{ $sys.id }}", "{{ $var.database }}")

    assert errors(rename) == []


# --- warnings -----------------------------------------------------------------------------


def test_namespace_in_a_template_is_a_warning():
    def namespaced(document):
        resource = templates(document)[1]["resource"]
        resource["manifest"] = resource["manifest"].replace(
            "metadata:\n", "metadata:\n  namespace: prod\n"
        )

    result = check(namespaced)
    assert result.errors == []
    assert result.warnings == [
        f"{CREATE}.templates[1].resource.manifest: "
        "metadata.namespace is replaced by the instance's namespace"
    ]


def test_set_owner_reference_is_a_warning():
    result = check(lambda d: templates(d)[1]["resource"].update(setOwnerReference=True))

    assert result.errors == []
    assert result.warnings == [
        f"{CREATE}.templates[1].resource.setOwnerReference: "
        "ignored: there is no Workflow object here to own the resource"
    ]
    assert (
        result.spec.main.verbs["create"]
        .workflow.templates["apply-secret"]
        .resource.set_owner_reference
    )


@pytest.mark.parametrize(
    ("verb", "seconds"),
    [("create", 3600), ("restore", 3600), ("backup", 7200), ("modify", 1800), ("delete", 1800)],
)
def test_missing_deadline_is_a_warning_and_the_platform_default_applies(verb, seconds):
    result = check(lambda d: workflow(d, verb).pop("activeDeadlineSeconds"))

    assert result.errors == []
    assert result.warnings == [
        f"services[0].systemWorkflows.{verb}.workflow.activeDeadlineSeconds: "
        f"not set; the platform default for {verb} ({seconds} s) applies"
    ]
    assert result.spec.main.verbs[verb].workflow.active_deadline_seconds == seconds


def test_platform_deadlines_are_configurable():
    document = yaml.safe_load(WORKFLOWS)
    workflow(document, "create").pop("activeDeadlineSeconds")
    workflow(document, "modify").pop("activeDeadlineSeconds")
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True)

    spec = validate(text, deadlines={"create": 120, "*": 300}).spec

    assert spec.main.verbs["create"].workflow.active_deadline_seconds == 120
    assert spec.main.verbs["modify"].workflow.active_deadline_seconds == 300


# --- x-opsdeck, pricing, top level --------------------------------------------------------


def test_usage_rule_that_is_not_cel():
    assert errors(lambda d: d["x-opsdeck"]["usage"].update(cpu="double(var.cpu) *")) == [
        'x-opsdeck.usage.cpu: cannot parse CEL expression "double(var.cpu) *" at line 1, column 17'
    ]


def test_usage_rule_that_fails_on_the_default_parameters():
    found = errors(lambda d: d["x-opsdeck"]["usage"].update(cpu="var.cpu * 0.5"))

    assert len(found) == 1
    assert found[0].startswith("x-opsdeck.usage.cpu: fails with the default parameters (")
    assert found[0].endswith("); convert numbers with double()")


def test_usage_rule_that_does_not_give_a_number():
    assert errors(lambda d: d["x-opsdeck"]["usage"].update(cpu="var.superuser")) == [
        "x-opsdeck.usage.cpu: gives BoolType(False) with the default parameters; "
        "a usage rule must give a number"
    ]


def test_usage_rule_that_runs_away_is_an_error_within_seconds_not_minutes():
    sixty = "[" + ",".join(str(i) for i in range(60)) + "]"
    rule = (
        f"double(var.cpu) + double({sixty}.map(a, {sixty}.map(b, {sixty}.map(c, "
        f"{sixty}.map(d, a + b + c + d)))).size())"
    )
    started = time.monotonic()

    found = errors(lambda d: d["x-opsdeck"]["usage"].update(cpu=rule))

    assert time.monotonic() - started < 30
    assert found == [
        "x-opsdeck.usage.cpu: CEL: the expression exceeded its time limit of 2 s "
        "with the default parameters"
    ]


# An unterminated string of escaped backslashes: CEL's lexer backtracks over it for hours.
BACKTRACKING = '"' + "\\\\" * 40


def test_a_cel_expression_whose_parse_runs_away_is_an_error_within_seconds_not_hours():
    started = time.monotonic()

    found = errors(lambda d: d["x-opsdeck"]["usage"].update(cpu=BACKTRACKING))
    condition = errors(
        lambda d: templates(d)[2]["resource"].update(successCondition=f"cel: {BACKTRACKING}")
    )

    assert time.monotonic() - started < 30
    assert found == [
        f'x-opsdeck.usage.cpu: cannot parse CEL expression "{BACKTRACKING}": CEL: the '
        "expression exceeded its time limit of 5 s"
    ]
    assert condition == [
        f"{CREATE}.templates[2].resource.successCondition: invalid CEL expression: CEL: the "
        "expression exceeded its time limit of 5 s"
    ]


def test_a_jq_filter_whose_compiling_takes_all_memory_is_refused_at_load():
    # jq folds constants as it compiles: this one is a string of a gigabyte.
    def output(document):
        valued = templates(document)[2]["outputs"]["parameters"][0]
        valued["valueFrom"] = {"jqFilter": '"x" * 1000000000'}

    assert errors(output) == [
        f"{CREATE}.templates[2].outputs.parameters[0].valueFrom.jqFilter: jq: the filter "
        "exceeded its memory limit of 256 MiB"
    ]


def test_usage_rule_reading_an_unknown_parameter():
    assert errors(lambda d: d["x-opsdeck"]["usage"].update(cpu="double(var.cores) * 2.0")) == [
        'x-opsdeck.usage.cpu: undefined parameter reference var.cores; no apiParameter "cores"'
    ]


def test_usage_rule_for_an_unknown_dimension():
    assert errors(lambda d: d["x-opsdeck"]["usage"].update(gpu="1")) == [
        'x-opsdeck.usage.gpu: unknown dimension "gpu"; expected one of cpu, memory, storage, '
        "replica, deploymentCell, backupStorage, base"
    ]


def test_parameter_group_naming_an_unknown_parameter():
    assert errors(lambda d: d["x-opsdeck"]["display"]["groups"][0]["parameters"].append("ram")) == [
        'x-opsdeck.display.groups[0].parameters: unknown parameter "ram"'
    ]


def test_parameter_group_listing_a_mapping_is_an_error_not_a_crash():
    # `- {key: cpu}` for `- cpu`: load_specs printed a TypeError's traceback.
    def mapped(document):
        document["x-opsdeck"]["display"]["groups"][0]["parameters"].append({"key": "cpu"})

    assert errors(mapped) == [
        "x-opsdeck.display.groups[0].parameters: {'key': 'cpu'} is not a parameter's key"
    ]


@pytest.mark.parametrize("dimension", [{"name": "cpu"}, ["cpu"]])
def test_a_pricing_dimension_that_is_not_text_is_an_error_not_a_crash(dimension):
    found = errors(lambda d: d.update(pricing=[{"dimension": dimension, "price": "1"}]))

    assert [e.split(":")[0] for e in found] == ["pricing[0].dimension"]


def test_options_written_as_yaml_numbers_are_offered_as_their_values_are_written():
    # `[0.5, 1.0, 2.0]`: the form offered "2.0", and choosing it was refused with "Must be one
    # of: 0.5, 1.0, 2.0.", the value read back being "2".
    spec = check(lambda d: parameter(d, "cpu").update(options=[0.5, 1.0, 2.0], defaultValue=1))

    assert spec.errors == []
    cpu = next(p for p in spec.spec.main.parameters if p.key == "cpu")
    assert cpu.options == ["0.5", "1", "2"]
    assert all(params.validate_parameters([cpu], {"cpu": o}) for o in ("0.5", "1.0", "2", 2.0))


@pytest.mark.parametrize(
    ("key", "options", "why"),
    [
        ("cpu", ["1", "one"], "Must be a number."),
        ("instances", ["1", "3", "7"], "Must be between 1 and 5."),
        ("cpu", ["1", "1.0"], "offered twice"),
    ],
)
def test_an_option_no_one_could_choose_is_an_error(key, options, why):
    found = errors(lambda d: parameter(d, key).update(options=options, defaultValue="1"))

    assert len(found) == 1 and f".options[{len(options) - 1}]" in found[0] and why in found[0]


def test_a_password_no_generated_one_could_meet_is_an_error():
    # A rule letters, digits and URI's marks never meet: the customer who left it empty, as
    # its help says, would have been given one that breaks it.
    found = errors(lambda d: parameter(d, "password").update(regex="^.*[!#%].*$"))

    assert len(found) == 1 and "no password generated" in found[0]


@pytest.mark.parametrize("minimum", [5_000_000, 1_000_000_000])
def test_a_password_longer_than_opsdeck_generates_is_an_error_found_at_once(minimum):
    """`limits.min` of a billion characters ran the load out of memory (it drew passwords of
    that length to judge them), and five million was accepted: every create would have drawn
    and stored a password no Kubernetes Secret holds."""
    found = errors(lambda d: parameter(d, "password").update(limits={"min": minimum}))

    assert len(found) == 1
    assert "longer than Opsdeck makes them (at most 1024 characters)" in found[0]


def test_a_password_as_long_as_opsdeck_generates_is_accepted():
    found = errors(lambda d: parameter(d, "password").update(limits={"min": 1024}))

    assert found == []


# Starts with four lowercase letters: a random draw of 24 letters and digits meets it about
# one time in 30 (64 draws missed it one time in 6).
NOW_AND_THEN = "^[a-z]{4}[A-Za-z0-9._~-]*$"


def test_a_password_rule_is_judged_alike_at_every_load():
    outcomes = {
        tuple(errors(lambda d: parameter(d, "password").update(regex=NOW_AND_THEN)))
        for _ in range(40)
    }

    assert outcomes == {()}


@pytest.mark.parametrize(
    "change",
    [
        # No generated password (24 characters) meets it.
        lambda d: parameter(d, "password").update(regex="^[A-Za-z0-9]{12,20}$"),
        lambda d: parameter(d, "cpu").update(options=["1", "2", "4", "four"]),
    ],
)
def test_a_stored_version_reads_a_rule_added_since_as_a_warning(change):
    """A version stored before a rule was added must still load: its instances' pages were
    server errors, and nothing could be done with them."""
    found = errors(change)
    assert len(found) == 1

    stored = check_stored(change)

    assert stored.errors == [] and found[0] in stored.warnings


def test_plan_key_must_be_a_slug():
    assert errors(lambda d: d["x-opsdeck"].update(plan="Postgres Prod")) == [
        'x-opsdeck.plan: "Postgres Prod" is not a slug (lowercase letters, digits, -)'
    ]


def test_pricing_dimension_and_price():
    def bad(document):
        document["pricing"] = [
            {"dimension": "gpu", "price": "1"},
            {"dimension": "cpu", "price": "x"},
        ]

    assert errors(bad) == [
        'pricing[0].dimension: unknown dimension "gpu"; expected one of cpu, memory, storage, '
        "replica, deploymentCell, backupStorage, base",
        'pricing[1].price: "x" is not a price',
    ]


def test_max_instances_must_be_a_whole_number():
    assert errors(lambda d: d.update(maxNumberOfInstancesAllowed="many")) == [
        'maxNumberOfInstancesAllowed: "many" is not a whole number of at least 0'
    ]


def test_name_and_services_are_required():
    assert validate("description: nothing else\n").errors == [
        "name: is required",
        "services: at least one service is required",
    ]


# --- legacy -------------------------------------------------------------------------------


def test_legacy_readiness_path_outside_the_supported_subset():
    def recursive(document):
        readiness = service(document)["operatorCRDConfiguration"]["readinessConditions"]
        readiness["$var._crd..phase"] = "done"

    found = errors(recursive, EXAMPLE)
    assert len(found) == 1
    assert found[0].startswith(
        'services[0].operatorCRDConfiguration.readinessConditions["$var._crd..phase"]: '
    )


def test_legacy_multi_document_template():
    def two(document):
        crd = service(document)["operatorCRDConfiguration"]
        crd["template"] += "---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: x\n"

    assert errors(two, EXAMPLE) == [
        "services[0].operatorCRDConfiguration.template: the manifest holds 2 documents; a "
        "resource template applies exactly one Kubernetes object (use one template per object)"
    ]


def test_legacy_readiness_with_spaces_is_accepted_because_it_becomes_cel():
    assert validate(EXAMPLE).errors == []


def test_item_is_defined_only_in_a_task_with_items():
    def fan_out(document):
        tasks(document)[0]["arguments"]["parameters"][0]["value"] = "{{item}}"

    assert errors(fan_out) == [
        f"{CREATE}.templates[0].dag.tasks[0].arguments.parameters.ns: undefined reference "
        "item: only a task with withItems or withParam defines item"
    ]
    assert errors(lambda d: (fan_out(d), tasks(d)[0].update(withItems=["a", "b"]))) == []


def test_workflow_status_may_be_read_by_an_exit_handler():
    def on_exit(document):
        workflow(document, "create")["onExit"] = "apply-secret"
        resource = templates(document)[1]["resource"]
        resource["manifest"] += "  annotations:\n    result: '{{workflow.status}}'\n"

    assert errors(on_exit) == []


@pytest.mark.parametrize(
    ("status", "message"),
    [
        ("Cluster", "x-opsdeck.status: must be a mapping with apiVersion and kind"),
        ({"kind": "Cluster"}, "x-opsdeck.status.apiVersion: is required (text)"),
        (
            {"apiVersion": "apps/v1", "kind": "Deployment"},
            'x-opsdeck.status.kind: "Deployment" is not a kind this plan uses',
        ),
        (
            {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "fields": ["phase"]},
            "x-opsdeck.status.fields: must map what the portal shows to paths in the object",
        ),
        (
            {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster", "fields": {"cpu": "x"}},
            "x-opsdeck.status.fields.cpu: is not one of phase, ready, total, primary, "
            "conditions, recoverableFrom, recoverableUntil",
        ),
    ],
)
def test_the_status_object_must_be_one_the_plan_uses(status, message):
    def change(document):
        document["x-opsdeck"]["status"] = status

    assert message in errors(change)


@pytest.mark.parametrize("name", ["", "  ", 7, "x" * 101])
def test_a_service_name_must_be_short_text(name):
    def change(document):
        document["x-opsdeck"]["serviceName"] = name

    assert "x-opsdeck.serviceName: must be text of 1 to 100 characters" in errors(change)


def test_a_status_object_of_a_kind_the_plan_uses_is_accepted():
    def change(document):
        document["x-opsdeck"]["status"] = {
            "apiVersion": "postgresql.cnpg.io/v1",
            "kind": "Cluster",
            "fields": {"phase": "status.phase", "ready": "status.readyInstances"},
        }

    assert errors(change) == []


STATUS = {"apiVersion": "postgresql.cnpg.io/v1", "kind": "Cluster"}


@pytest.mark.parametrize(
    ("health", "status", "message"),
    [
        ({"condition": "cel: self.status.ready"}, None,
         "x-opsdeck.health: needs x-opsdeck.status: the object the condition looks at"),
        ({"reason": "status.phase"}, STATUS, "x-opsdeck.health.condition: is required"),
        ({"condition": "cel: self.status.("}, STATUS, "x-opsdeck.health.condition: "),
        ({"condition": "cel: true", "reason": 7}, STATUS,
         "x-opsdeck.health.reason: must be a dotted path such as status.phase"),
    ],
)  # fmt: skip
def test_a_health_rule_is_a_condition_over_the_status_object(health, status, message):
    def change(document):
        document["x-opsdeck"]["health"] = health
        if status:
            document["x-opsdeck"]["status"] = status

    assert any(error.startswith(message) for error in errors(change)), errors(change)


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ({"role": "app.kubernetes.io/role"}, "x-opsdeck.servers.selector: is required"),
        ({"selector": "app in (db"}, "x-opsdeck.servers.selector: is not a label selector"),
        ({"selector": "app=db", "limits": {"disk": "1.0"}},
         "x-opsdeck.servers.limits.disk: is not one of cpu, memory"),
        ({"selector": "app=db", "limits": {"cpu": "double(var.cores)"}},
         'x-opsdeck.servers.limits.cpu: undefined parameter reference var.cores'),
        ({"selector": "app=db", "logs": "json"},
         "x-opsdeck.servers.logs: must map level and message to dotted paths"),
        ({"selector": "app=db", "logs": {"level": "level"}},
         "x-opsdeck.servers.logs.message: is required"),
        ({"selector": "app=db", "logs": {"message": "msg", "time": "ts"}},
         "x-opsdeck.servers.logs.time: is not one of level, message"),
        ({"selector": "app=db", "logs": {"message": ["record..message"]}},
         "x-opsdeck.servers.logs.message: must be a dotted path"),
        ({"selector": "app=db", "logs": {"message": ["a", "b", "c", "d", "e", "f"]}},
         "x-opsdeck.servers.logs.message: must be a dotted path"),
    ],
)  # fmt: skip
def test_servers_are_found_by_a_label_selector_and_their_limits_are_numbers(servers, message):
    def change(document):
        document["x-opsdeck"]["servers"] = servers

    assert any(error.startswith(message) for error in errors(change)), errors(change)


def test_a_servers_limit_that_gives_no_number_says_a_limit_must_give_one():
    def change(document):
        document["x-opsdeck"]["servers"] = {"selector": "app=db", "limits": {"cpu": '"a lot"'}}

    [error] = errors(change)
    assert error.startswith("x-opsdeck.servers.limits.cpu: gives")
    assert error.endswith("with the default parameters; a limit must give a number")


def test_the_shipped_plans_health_and_servers_are_accepted():
    def change(document):
        document["x-opsdeck"]["status"] = STATUS
        document["x-opsdeck"]["health"] = {
            "condition": "cel: self.status.readyInstances == self.spec.instances",
            "reason": "status.phase",
        }
        document["x-opsdeck"]["servers"] = {
            "selector": "cnpg.io/podRole=instance", "role": "cnpg.io/instanceRole",
            "limits": {"cpu": "double(var.cpu)", "memory": "double(var.cpu) * 1073741824.0"},
            "logs": {"level": ["record.error_severity", "level"], "message": "msg"},
        }  # fmt: skip

    assert errors(change) == []


def _requires(**requires) -> Callable[[dict], None]:
    def change(document: dict) -> None:
        verb = service(document)["systemWorkflows"]["backup"]
        verb["x-opsdeck"] = {"requires": requires}

    return change


def test_a_verbs_requirement_is_a_true_or_false_over_the_parameters_with_a_message():
    message = "Backup needs two servers."
    valid = check(_requires(when="double(var.instances) >= 2.0", message=message))

    assert valid.errors == []
    requirement = valid.spec.main.verbs["backup"].requires
    assert (requirement.when, requirement.message) == ("double(var.instances) >= 2.0", message)
    where = "services[0].systemWorkflows.backup.x-opsdeck.requires"
    assert errors(_requires(when="var.servers >= 2", message=message)) == [
        f'{where}.when: undefined parameter reference var.servers; no apiParameter "servers"'
    ]
    assert errors(_requires(when="double(var.instances) * 2.0", message=message)) == [
        f"{where}.when: gives 2.0 with the default parameters; it must give true or false"
    ]
    assert errors(_requires(when="var.instances >=", message=message))[0].startswith(
        f'{where}.when: cannot parse CEL expression "var.instances >="'
    )
    assert errors(_requires(when="double(var.instances) >= 2.0")) == [
        f"{where}.message: is required"
    ]
    assert errors(_requires(when="true", message=message, unless="x")) == [
        f"{where}: unknown key unless; expected when and message"
    ]


def test_a_requirement_reading_a_password_is_refused():
    """A Password never reaches an expression: a requirement reading one loaded (a password
    has no default, so nothing evaluated it), and the verb was refused on every instance."""
    where = "services[0].systemWorkflows.backup.x-opsdeck.requires.when"

    assert errors(_requires(when='var.password != ""', message="Set a password.")) == [
        f"{where}: var.password is a Password: passwords never reach an expression"
    ]
    assert errors(lambda d: d["x-opsdeck"]["usage"].update(cpu="size(var.password)")) == [
        "x-opsdeck.usage.cpu: var.password is a Password: passwords never reach an expression"
    ]


def test_a_deadline_longer_than_a_year_is_refused():
    """As every duration is: a backoff of 9000h was refused, an activeDeadlineSeconds of 463
    days loaded."""

    def long(document):
        workflow(document, "create")["activeDeadlineSeconds"] = 40_000_000
        templates(document)[1]["activeDeadlineSeconds"] = 40_000_000

    assert errors(long) == [
        f'{CREATE}.templates[1].activeDeadlineSeconds: "40000000" is longer than a year',
        f'{CREATE}.activeDeadlineSeconds: "40000000" is longer than a year',
    ]


def test_only_a_float64_parameter_can_be_grow_only():
    def grow_only(key: str, value) -> Callable[[dict], None]:
        return lambda document: parameter(document, key).update({"x-opsdeck": {"growOnly": value}})

    assert check(grow_only("storageGi", True)).spec.parameter("storageGi").grow_only
    assert errors(grow_only("database", True)) == [
        f"{PARAMS}[3].x-opsdeck.growOnly: only a Float64 parameter can grow"
    ]
    assert errors(grow_only("storageGi", "yes")) == [
        f"{PARAMS}[2].x-opsdeck.growOnly: must be true or false"
    ]


def test_a_regex_message_is_one_line_for_a_parameter_with_a_regex():
    def regex_message(key: str, value) -> Callable[[dict], None]:
        return lambda document: parameter(document, key).update(
            {"x-opsdeck": {"regexMessage": value}}
        )

    loaded = check(regex_message("database", "Lowercase letters only."))
    assert loaded.errors == []
    assert loaded.spec.parameter("database").regex_message == "Lowercase letters only."
    for bad in ("two\nlines", "", 42):
        assert errors(regex_message("database", bad)) == [
            f"{PARAMS}[3].x-opsdeck.regexMessage: must be one line of text"
        ]
    assert errors(regex_message("database", "x" * 201)) == [
        f"{PARAMS}[3].x-opsdeck.regexMessage: must be at most 200 characters long"
    ]
    assert errors(regex_message("storageGi", "Digits.")) == [
        f"{PARAMS}[2].x-opsdeck.regexMessage: is for a parameter with a regex"
    ]


def test_a_string_parameter_reserves_words_and_prefixes_its_values_may_not_take():
    def reserved(key: str, value) -> Callable[[dict], None]:
        return lambda document: parameter(document, key).update({"x-opsdeck": {"reserved": value}})

    loaded = check(reserved("database", ["postgres", "pg_*"]))
    assert loaded.errors == []
    database = loaded.spec.parameter("database")
    for taken, why in [("postgres", "“postgres”"), ("pg_stat", "names starting with “pg_”")]:
        with pytest.raises(ValueError, match=f"The service keeps {why} for itself"):
            params.check(database, taken)
    params.check(database, "postgres2")  # neither the word nor the prefix
    params.check(database, "pg")
    for bad in ([], "postgres", [42], ["*"], ["a*b"], ["x"] * 101):
        assert errors(reserved("database", bad)) == [
            f"{PARAMS}[3].x-opsdeck.reserved: must be a list of 1 to 100 words, each may end in * "
            "(a prefix)"
        ]
    assert errors(reserved("storageGi", ["x"])) == [
        f"{PARAMS}[2].x-opsdeck.reserved: only a String parameter reserves values"
    ]


def test_a_float64_parameter_is_a_double_in_a_requirement():
    # A whole default (1) compared with a double, and a double with a whole number.
    assert check(_requires(when="var.instances >= 0.5", message="m")).errors == []
    assert check(_requires(when="var.instances >= 1", message="m")).errors == []


def test_no_requirement_on_a_verb_an_instance_must_always_be_able_to_run():
    def on(verb: str) -> Callable[[dict], None]:
        def change(document: dict) -> None:
            service(document)["systemWorkflows"][verb]["x-opsdeck"] = {
                "requires": {"when": "true", "message": "m"}
            }

        return change

    for verb in ("create", "modify", "delete", "restore", "deleteBackup"):
        assert errors(on(verb)) == [
            f"services[0].systemWorkflows.{verb}.x-opsdeck.requires: an instance must always be "
            f"able to {verb}: it takes no requirement"
        ]


def test_a_verbs_confirm_is_one_line_on_a_verb_sent_from_a_button():
    def confirm(verb: str, text) -> Callable[[dict], None]:
        return lambda document: service(document)["systemWorkflows"][verb].update(
            {"x-opsdeck": {"confirm": text}}
        )

    asked = check(confirm("backup", "Back up now? Writes slow down while it runs. "))
    assert asked.errors == []
    assert asked.spec.main.verbs["backup"].confirm == "Back up now? Writes slow down while it runs."
    assert check(confirm("backup", "")).spec.main.verbs["backup"].confirm == ""  # asks nothing
    assert check(lambda document: None).spec.main.verbs["backup"].confirm is None  # Opsdeck's
    where = "services[0].systemWorkflows"
    for bad in ("two\nlines", 42, None):
        assert errors(confirm("backup", bad)) == [
            f"{where}.backup.x-opsdeck.confirm: must be one line of text (empty: ask nothing)"
        ]
    assert errors(confirm("backup", "x" * 301)) == [
        f"{where}.backup.x-opsdeck.confirm: must be at most 300 characters long"
    ]
    assert errors(confirm("modify", "Sure?")) == [
        f"{where}.modify.x-opsdeck.confirm: modify is not sent from a button of its own: "
        "nothing to ask"
    ]


def test_a_verbs_x_opsdeck_is_a_mapping_of_known_keys():
    def x_opsdeck(value) -> Callable[[dict], None]:
        return lambda document: service(document)["systemWorkflows"]["backup"].update(
            {"x-opsdeck": value}
        )

    where = "services[0].systemWorkflows.backup.x-opsdeck"
    assert errors(x_opsdeck("requires")) == [f"{where}: must be a mapping"]
    assert errors(x_opsdeck({"require": {"when": "true", "message": "m"}})) == [
        f"{where}: unknown key require; expected requires or confirm"
    ]
