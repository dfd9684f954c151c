"""The injection-safe renderer: typing, interpolation, hostile values, errors, functions."""

import base64
import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from deployments.workflow.render import (
    Context,
    RenderError,
    references,
    render_manifest,
    render_text,
    render_value,
)

SPECS = Path("/work/shared/reference/omnistrate-specs")
ALPHABET = set("abcdefghijklmnopqrstuvwxyz0123456789")


def make_ctx(**overrides: Any) -> Context:
    values: dict[str, Any] = {
        "var": {
            "postgresqlUsername": "app",
            "postgresqlDatabase": "appdb",
            "postgresqlPassword": "s3cret-pw",
            "numberOfInstances": 3.0,
            "storageSize": "20Gi",
            "instanceType": "t3.medium",
        },
        "sys": {
            "id": "inst-abc12345",
            "instanceId": "inst-abc12345",
            "namespace": "inst-abc12345",
            "deploymentCell": {
                "region": "us-east-1",
                "publicSubnetIDs": [{"id": "subnet-a"}, {"id": "subnet-b"}, {"id": "subnet-c"}],
                "privateSubnetIDs": [],
            },
            "compute": {"node": {"instanceType": "t3.medium"}},
            "deployment": {"resourceID": "r-0001"},
            "network": {"externalClusterEndpoint": "db.example.com"},
            "restore": {"metadata": {"backupName": "b-42"}},
        },
        "secret": {"S3_KEY": "AKIA123"},
        "seed": "instance-seed",
    }
    values.update(overrides)
    return Context(**values)


def with_var(**var: Any) -> Context:
    return make_ctx(var=var)


def shape(node: Any) -> Any:
    """The keys of an object, recursively, without its scalar values."""
    if isinstance(node, dict):
        return {key: shape(value) for key, value in node.items()}
    if isinstance(node, list):
        return [shape(item) for item in node]
    return None


def template_shape(template: str) -> Any:
    """The shape a template has when every placeholder is a harmless word."""
    return shape(yaml.safe_load(re.sub(r"\{\{[^{}\n]*\}\}", "x", template)))


def spec_templates(name: str) -> list[str]:
    crd = yaml.safe_load((SPECS / name).read_text())["services"][0]["operatorCRDConfiguration"]
    return [crd["template"], *crd.get("supplementalFiles", [])]


# --- whole-scalar typing --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, 5),
        (2.5, 2.5),
        (True, True),
        (False, False),
        ("hello", "hello"),
        ({"a": 1, "b": [1, "x"]}, {"a": 1, "b": [1, "x"]}),
        ([1, "two", {"three": 3}], [1, "two", {"three": 3}]),
        (None, None),
    ],
)
def test_placeholder_that_is_the_whole_scalar_takes_the_value_type(value, expected):
    rendered = render_manifest("spec:\n  v: {{ $var.v }}\n", with_var(v=value))
    assert rendered["spec"]["v"] == expected
    assert type(rendered["spec"]["v"]) is type(expected)


def test_integral_float_renders_as_integer_whole_and_interpolated():
    template = "spec:\n  instances: {{ $var.n }}\n  label: size-{{ $var.n }}\n"
    rendered = render_manifest(template, with_var(n=3.0))
    assert rendered["spec"]["instances"] == 3
    assert type(rendered["spec"]["instances"]) is int
    assert rendered["spec"]["label"] == "size-3"


def test_integral_floats_inside_json_values_render_as_integers():
    rendered = render_manifest("spec: {{ $var.cfg }}\n", with_var(cfg={"a": 2.0, "b": [1.0, 1.5]}))
    assert rendered["spec"] == {"a": 2, "b": [1, 1.5]}
    assert type(rendered["spec"]["a"]) is int


@pytest.mark.parametrize("text", ["3", "yes", "no", "on", "true", "null", "1e3", "0x1f", "~"])
def test_string_values_stay_strings_however_they_look(text):
    rendered = render_manifest("v: {{ $var.s }}\n", with_var(s=text))
    assert rendered["v"] == text


def test_quoted_whole_placeholder_renders_as_text_for_string_only_fields():
    template = "metadata:\n  annotations:\n    ttl: \"{{ $var.ttl }}\"\n    flag: '{{ $var.on }}'\n"
    rendered = render_manifest(template, with_var(ttl=60.0, on=True))
    assert rendered["metadata"]["annotations"] == {"ttl": "60", "flag": "true"}


def test_placeholder_in_block_scalar_is_interpolated_into_the_text():
    template = "data:\n  postgresql.conf: |\n    max_connections = {{ $var.max }}\n    x = 1\n"
    rendered = render_manifest(template, with_var(max=100.0))
    assert rendered["data"]["postgresql.conf"] == "max_connections = 100\nx = 1\n"


def test_whole_placeholder_in_flow_collections_keeps_types():
    template = "spec: {replicas: {{ $var.n }}, names: [{{ $var.a }}, {{ $var.b }}]}\n"
    rendered = render_manifest(template, with_var(n=2.0, a="x", b=True))
    assert rendered == {"spec": {"replicas": 2, "names": ["x", True]}}


# --- interpolation --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("abc", "abc"),
        (7, "7"),
        (7.0, "7"),
        (2.5, "2.5"),
        (True, "true"),
        (False, "false"),
        (None, ""),
        ({"a": 1.0, "b": "c"}, '{"a":1,"b":"c"}'),
        (["x", 2], '["x",2]'),
    ],
)
def test_placeholder_inside_a_longer_string_is_interpolated_as_text(value, text):
    rendered = render_manifest("v: pre-{{ $var.v }}-post\n", with_var(v=value))
    assert rendered["v"] == f"pre-{text}-post"


def test_several_placeholders_interpolate_into_one_scalar():
    template = "tags: resource={{ $sys.deployment.resourceID }},instance={{ $sys.id }}\n"
    rendered = render_manifest(template, make_ctx())
    assert rendered["tags"] == "resource=r-0001,instance=inst-abc12345"


def test_placeholder_in_a_mapping_key_is_interpolated_as_text():
    rendered = render_manifest(
        "labels:\n  {{ $var.k }}: v\n  n{{ $var.i }}: w\n", with_var(k="team", i=1.0)
    )
    assert rendered == {"labels": {"team": "v", "n1": "w"}}


def test_dates_in_a_template_stay_text_as_kubernetes_reads_them():
    rendered = render_manifest(
        "spec:\n  targetTime: 2024-01-01 10:00:00\n  day: 2024-01-01\n", make_ctx()
    )
    assert rendered["spec"] == {"targetTime": "2024-01-01 10:00:00", "day": "2024-01-01"}


def test_yaml_alias_of_a_placeholder_repeats_the_same_value():
    template = "a: &pw {{ $func.random(string, 16) }}\nb: *pw\n"
    rendered = render_manifest(template, make_ctx())
    assert rendered["a"] == rendered["b"]


def test_aliases_of_a_placeholder_cannot_render_an_object_larger_than_the_api_takes():
    """A placeholder is a token of thirty characters whatever it stands for: a thousand aliases
    of one over a 1 MB value passed the bound on the YAML's expanded text and rendered a
    gigabyte in the worker."""
    template = (
        "metadata: {annotations: {note: &note '{{ $var.note }}'}}\n"
        "data:\n  copies: [" + ", ".join(["*note"] * 1000) + "]\n"
    )

    with pytest.raises(RenderError, match="more than 3 MiB, more than the Kubernetes API takes"):
        render_manifest(template, with_var(note="x" * 1_000_000))
    assert render_manifest(template, with_var(note="x" * 1000))["data"]["copies"][999] == "x" * 1000


def test_a_value_as_large_as_the_api_takes_is_filled_in():
    rendered = render_manifest("data: {big: '{{ $var.big }}'}\n", with_var(big="y" * (3 << 20)))

    assert len(rendered["data"]["big"]) == 3 << 20


def test_rendered_object_does_not_share_values_with_the_context():
    ctx = with_var(cfg={"list": [1, 2]})
    rendered = render_manifest("spec: {{ $var.cfg }}\n", ctx)
    rendered["spec"]["list"].append(3)
    assert ctx.var["cfg"] == {"list": [1, 2]}


def test_template_text_that_looks_like_a_token_stays_literal():
    template = "a: opsdeck-tok-0-0123456789abcdef\nb: {{ $sys.id }}\n"
    rendered = render_manifest(template, make_ctx())
    assert rendered == {"a": "opsdeck-tok-0-0123456789abcdef", "b": "inst-abc12345"}


# --- bare references ------------------------------------------------------------------------


def test_bare_reference_is_substituted_when_it_is_the_whole_value():
    template = 'host: $sys.network.externalClusterEndpoint\nn: $var.n\nq: "$sys.id"\n'
    rendered = render_manifest(template, with_var(n=4.0))
    assert rendered == {"host": "db.example.com", "n": 4, "q": "inst-abc12345"}


def test_bare_reference_inside_a_longer_string_stays_literal():
    rendered = render_manifest("host: reader-$sys.id\ncmd: echo $var.x\n", make_ctx())
    assert rendered == {"host": "reader-$sys.id", "cmd": "echo $var.x"}


def test_bare_reference_as_a_mapping_key_stays_literal():
    rendered = render_manifest("$var.x: 1\n", make_ctx())
    assert rendered == {"$var.x": 1}


# --- the real public specs ------------------------------------------------------------------


def test_examples_cnpg_template_renders_unchanged():
    (template,) = spec_templates("examples-cnpg.yaml")
    rendered = render_manifest(template, make_ctx(), where="services[0].template")
    assert rendered == yaml.safe_load(template)


def test_byoa_spec_cluster_template_renders_with_exactly_its_keys():
    template = spec_templates("postgres-paas-operator-byoa-spec.yaml")[0]
    rendered = render_manifest(template, make_ctx(), where="services[0].template")

    assert shape(rendered) == template_shape(template)
    assert rendered["metadata"]["name"] == "inst-abc12345"
    assert rendered["spec"]["instances"] == 3
    assert rendered["spec"]["bootstrap"]["initdb"] == {
        "owner": "app",
        "database": "appdb",
        "secret": {"name": "basic-auth"},
    }
    terms = rendered["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"][0]["matchExpressions"]
    assert [term["values"] for term in terms] == [
        ["omnistrate"],
        ["us-east-1"],
        ["t3.medium"],
        ["r-0001"],
    ]
    ro, rw = rendered["spec"]["managed"]["services"]["additional"]
    ro_meta = ro["serviceTemplate"]["metadata"]
    assert ro_meta["name"] == "inst-abc12345-cluster-ro"
    assert ro_meta["annotations"]["external-dns.alpha.kubernetes.io/hostname"] == (
        "reader-db.example.com"
    )
    assert ro_meta["annotations"]["external-dns.alpha.kubernetes.io/ttl"] == "60"
    assert ro_meta["annotations"]["service.beta.kubernetes.io/aws-load-balancer-subnets"] == (
        "subnet-a,subnet-b,subnet-c"
    )
    assert ro_meta["annotations"][
        "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags"
    ] == (
        "omnistrate.com/resource=r-0001,omnistrate.com/instance=inst-abc12345,"
        "omnistrate.com/managed-by=omnistrate"
    )
    rw_meta = rw["serviceTemplate"]["metadata"]
    assert rw_meta["name"] == "inst-abc12345-cluster-rw"
    assert rw_meta["annotations"]["external-dns.alpha.kubernetes.io/hostname"] == "db.example.com"


def test_byoa_spec_secret_renders_base64_credentials():
    template = spec_templates("postgres-paas-operator-byoa-spec.yaml")[1]
    rendered = render_manifest(template, make_ctx(), where="services[0].supplementalFiles[0]")
    assert shape(rendered) == template_shape(template)
    assert rendered["metadata"] == {"name": "basic-auth", "namespace": "inst-abc12345"}
    assert base64.b64decode(rendered["data"]["username"]) == b"app"
    assert base64.b64decode(rendered["data"]["password"]) == b"s3cret-pw"


def test_byoa_spec_endpoint_hosts_render_bare_and_wrapped():
    spec = yaml.safe_load((SPECS / "postgres-paas-operator-byoa-spec.yaml").read_text())
    endpoints = render_value(spec["services"][0]["endpointConfiguration"], make_ctx())
    assert endpoints["writer"]["host"] == "db.example.com"
    assert endpoints["reader"]["host"] == "reader-db.example.com"
    assert endpoints["writer"]["ports"] == [5432]


def test_byoa_spec_templates_report_their_references():
    cluster, secret = spec_templates("postgres-paas-operator-byoa-spec.yaml")
    assert references(cluster) == [
        "$sys.id",
        "$var.postgresqlUsername",
        "$var.postgresqlDatabase",
        "$sys.deploymentCell.region",
        "$sys.compute.node.instanceType",
        "$sys.deployment.resourceID",
        "$var.numberOfInstances",
        "$var.storageSize",
        "$sys.network.externalClusterEndpoint",
        "$sys.deploymentCell.publicSubnetIDs[*].id",
    ]
    assert references(secret) == ["$sys.id", "$var.postgresqlUsername", "$var.postgresqlPassword"]


# --- hostile values -------------------------------------------------------------------------

HOSTILE = [
    "line one\nline two",
    "evil: true",
    "a: b\nc: d",
    "{{ $var.other }}",
    "{{ $secret.S3_KEY }}",
    "$var.other",
    "$sys.id",
    "---\nkind: Secret",
    "x\n---\ny: 1",
    "...",
    "&anchor value",
    "*alias",
    "!!python/object/apply:os.system ['echo pwned']",
    "!!binary aGVsbG8=",
    "value # comment",
    "#not a comment",
    "'single' \"double\" `back`",
    '"',
    "'",
    "{a: 1}",
    "[1, 2]",
    "- item",
    "? key",
    "| block",
    "> folded",
    "%YAML 1.1",
    "@at",
    "opsdeck-tok-0-0123456789abcdef",
    "\t\r\x00 control",
    "ünïcødé ✓",
    "x" * 100_000,
    "",
    " ",
]

HOSTILE_TEMPLATE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ $sys.id }}
  labels: {owner: {{ $var.h }}, fixed: yes}
  annotations:
    quoted: "{{ $var.h }}"
    single: '{{ $var.h }}'
    inside: pre-{{ $var.h }}-post
data:
  plain: {{ $var.h }}
  block: |
    {{ $var.h }}
  list:
    - {{ $var.h }}
    - [{{ $var.h }}]
  encoded: {{ $func.base64encode($var.h) }}
"""


@pytest.mark.parametrize("hostile", HOSTILE, ids=lambda value: repr(value)[:30])
def test_hostile_value_stays_literal_and_adds_no_keys(hostile):
    rendered = render_manifest(HOSTILE_TEMPLATE, with_var(h=hostile, other="INJECTED"))

    assert shape(rendered) == template_shape(HOSTILE_TEMPLATE)
    assert rendered["metadata"]["name"] == "inst-abc12345"
    assert rendered["metadata"]["labels"] == {"owner": hostile, "fixed": True}
    assert rendered["metadata"]["annotations"] == {
        "quoted": hostile,
        "single": hostile,
        "inside": f"pre-{hostile}-post",
    }
    assert rendered["data"]["plain"] == hostile
    assert rendered["data"]["block"] == f"{hostile}\n"
    assert rendered["data"]["list"] == [hostile, [hostile]]
    assert base64.b64decode(rendered["data"]["encoded"]) == hostile.encode()
    assert rendered["kind"] == "ConfigMap"


@pytest.mark.parametrize("hostile", HOSTILE[:20], ids=lambda value: repr(value)[:30])
def test_hostile_values_from_every_source_stay_literal(hostile):
    ctx = make_ctx(
        var={"h": hostile},
        sys={"id": hostile},
        secret={"H": hostile},
        inputs={"h": hostile},
        workflow={"h": hostile, "status": hostile},
        tasks={"t": {"h": hostile}},
    )
    template = (
        "a: {{ $var.h }}\nb: {{ $sys.id }}\nc: {{ $secret.H }}\nd: {{ inputs.parameters.h }}\n"
        "e: {{workflow.parameters.h}}\nf: {{workflow.status}}\n"
        "g: {{tasks.t.outputs.parameters.h}}\nh: $sys.id\n"
    )
    rendered = render_manifest(template, ctx)
    assert rendered == dict.fromkeys("abcdefgh", hostile)


@pytest.mark.parametrize("hostile", ["a: b", "x\ny: 1", "{{ $var.k }}", "---", "k"])
def test_hostile_value_in_a_key_stays_one_key(hostile):
    rendered = render_manifest("labels:\n  {{ $var.k }}: v\n", with_var(k=hostile))
    assert rendered == {"labels": {hostile: "v"}}


def test_substituted_key_that_collides_with_another_key_is_refused():
    template = "metadata:\n  labels:\n    {{ $var.k }}: user\n    owner: platform\n"
    with pytest.raises(RenderError, match="'owner' appears twice") as caught:
        render_manifest(template, with_var(k="owner"), where="templates[0]")
    assert "templates[0] at metadata.labels" in str(caught.value)


def test_a_value_can_never_become_the_whole_object():
    with pytest.raises(RenderError, match="must be a mapping"):
        render_manifest("{{ $var.obj }}\n", with_var(obj={"kind": "Secret"}))


def test_a_json_value_fills_only_its_own_field():
    ctx = with_var(cfg={"kind": "Secret", "metadata": {"name": "stolen"}})
    rendered = render_manifest("kind: ConfigMap\ndata: {{ $var.cfg }}\n", ctx)
    assert rendered["kind"] == "ConfigMap"
    assert rendered["data"] == {"kind": "Secret", "metadata": {"name": "stolen"}}


# --- undefined references -------------------------------------------------------------------


@pytest.mark.parametrize(
    "ref",
    [
        "$var.missing",
        "$sys.missing",
        "$sys.deploymentCell.missing",
        "$sys.id.deeper",
        "$sys.deploymentCell.publicSubnetIDs[7].id",
        "$sys.deploymentCell.publicSubnetIDs[0].missing",
        "$sys.deploymentCell.region[0]",
        "$sys.deploymentCell.publicSubnetIDs[*].missing",
        "$sys.restore.metadata.missing",
        "$secret.MISSING",
        "inputs.parameters.missing",
        "workflow.parameters.missing",
        "workflow.status",
        "tasks.missing.outputs.parameters.p",
        "tasks.a.outputs.parameters.missing",
    ],
)
def test_undefined_reference_is_an_error_naming_it(ref):
    ctx = make_ctx(tasks={"a": {"p": "v"}})
    with pytest.raises(RenderError) as caught:
        render_manifest(
            f"spec:\n  v: {{{{ {ref} }}}}\n", ctx, where="templates[2].resource.manifest"
        )
    assert str(caught.value) == (
        f"undefined reference {{{{ {ref} }}}} in templates[2].resource.manifest at spec.v"
    )
    assert caught.value.reference == ref


def test_undefined_reference_inside_text_is_an_error_not_an_empty_string():
    with pytest.raises(RenderError, match=r"undefined reference \{\{ \$var\.missing \}\}"):
        render_manifest("name: pre-{{ $var.missing }}-post\n", make_ctx())


def test_undefined_reference_inside_a_function_names_the_reference():
    with pytest.raises(RenderError) as caught:
        render_manifest("p: {{ $func.base64encode($var.nope) }}\n", make_ctx(), where="t")
    assert str(caught.value) == (
        "undefined reference $var.nope (in {{ $func.base64encode($var.nope) }}) in t at p"
    )
    assert caught.value.reference == "$var.nope"


def test_undefined_bare_reference_is_an_error():
    with pytest.raises(RenderError, match=r"undefined reference \$sys\.nope in t at host"):
        render_manifest("host: $sys.nope\n", make_ctx(), where="t")


def test_undefined_reference_in_a_value_and_in_text_is_an_error():
    with pytest.raises(RenderError, match=r"undefined reference \{\{ inputs\.parameters\.ns \}\}"):
        render_value({"args": ["{{ inputs.parameters.ns }}"]}, make_ctx(), where="tasks[0]")
    with pytest.raises(RenderError, match=r"\{\{ tasks\.a\.outputs\.parameters\.x \}\} in when"):
        render_text("{{tasks.a.outputs.parameters.x}} == yes", make_ctx(), where="when")


def test_defined_null_value_is_not_undefined():
    ctx = make_ctx(tasks={"skipped": {"p": None}})
    assert render_text("[{{tasks.skipped.outputs.parameters.p}}]", ctx) == "[]"


def test_placeholder_in_a_yaml_comment_is_never_resolved():
    rendered = render_manifest("# uses {{ $var.missing }}\na: 1 # {{ $var.gone }}\n", make_ctx())
    assert rendered == {"a": 1}


@pytest.mark.parametrize(
    "placeholder",
    [
        "{{ $vr.x }}",
        "{{ $var }}",
        "{{ workflow.name }}",
        "{{ inputs.parameters }}",
        "{{ tasks.a.outputs.result }}",
        "{{ }}",
        "{{ 'literal' }}",
        "{{ $var.x $var.y }}",
        "{{ $var.x. }}",
        "{{ $func.nope($var.x) }}",
        "{{ $func.base64encode }}",
        "{{ $func.base64encode($var.x, $var.y) }}",
        "{{ $func.base64encode($var.x }}",
        "{{ $func.random(string) }}",
        "{{ $func.random(int, 8) }}",
        "{{ $func.random(string, 0) }}",
        "{{ $func.random(string, 99999) }}",
        "{{ $func.random(string, $var.n) }}",
        "{{ .Values.x }}",
    ],
)
def test_placeholder_not_understood_is_refused_everywhere(placeholder):
    ctx = make_ctx(var={"x": "1", "y": "2", "n": 8})
    with pytest.raises(RenderError, match="invalid placeholder"):
        render_manifest(f"a: {placeholder}\n", ctx)
    with pytest.raises(RenderError, match="invalid placeholder"):
        render_value(placeholder, ctx)
    with pytest.raises(RenderError, match="invalid placeholder"):
        references(placeholder)


# --- shape of the manifest ------------------------------------------------------------------


@pytest.mark.parametrize(
    "template",
    [
        "a: 1\n---\nb: 2\n",
        "---\nkind: A\n---\nkind: B\n",
        "kind: A\n---\nkind: {{ $sys.id }}\n",
    ],
)
def test_multi_document_manifest_is_refused(template):
    with pytest.raises(RenderError, match="exactly one object, found 2 documents in t"):
        render_manifest(template, make_ctx(), where="t")


@pytest.mark.parametrize(
    ("template", "described"),
    [
        ("- a\n- b\n", "a list"),
        ("just text\n", "a scalar"),
        ("{{ $sys.id }}\n", "a scalar"),
        ("42\n", "a scalar"),
    ],
)
def test_manifest_that_is_not_a_mapping_is_refused(template, described):
    with pytest.raises(RenderError, match=f"must be a mapping .*, not {described} in t"):
        render_manifest(template, make_ctx(), where="t")


@pytest.mark.parametrize("template", ["", "\n", "# only a comment\n", "---\n"])
def test_empty_manifest_is_refused(template):
    with pytest.raises(RenderError, match="manifest is empty"):
        render_manifest(template, make_ctx())


def test_stray_document_separators_around_one_object_are_accepted():
    assert render_manifest("---\nkind: A\n---\n", make_ctx()) == {"kind": "A"}


def test_invalid_yaml_is_refused_showing_the_placeholder_not_the_token():
    with pytest.raises(RenderError, match=r"invalid YAML: .*\(line 1\) in t") as caught:
        render_manifest("a: {{ $sys.id }}: b\n", make_ctx(), where="t")
    assert "opsdeck-tok" not in str(caught.value)


def test_template_tags_cannot_construct_objects():
    with pytest.raises(RenderError, match="invalid YAML"):
        render_manifest("a: !!python/object/apply:os.system ['true']\n", make_ctx())
    with pytest.raises(RenderError, match=r"invalid YAML: .*\{\{ \$var\.n \}\}"):
        render_manifest("a: !!int {{ $var.n }}\n", with_var(n="x"))


def test_manifest_must_be_text():
    with pytest.raises(RenderError, match="manifest must be YAML text"):
        render_manifest({"kind": "A"}, make_ctx())  # type: ignore[arg-type]


def test_value_of_an_unsupported_type_is_refused():
    with pytest.raises(RenderError, match="cannot render a value of type object"):
        render_manifest("a: {{ $var.o }}\n", with_var(o=object()))


# --- $func.base64encode ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("placeholder", "decoded"),
    [
        ("{{ $func.base64encode('hello world') }}", "hello world"),
        ('{{ $func.base64encode("with, comma") }}', "with, comma"),
        ("{{ $func.base64encode($var.postgresqlPassword) }}", "s3cret-pw"),
        ("{{ $func.base64encode($var.numberOfInstances) }}", "3"),
        ("{{ $func.base64encode($secret.S3_KEY) }}", "AKIA123"),
        (
            "{{ $func.base64encode($sys.deploymentCell.publicSubnetIDs[*].id) }}",
            "subnet-a,subnet-b,subnet-c",
        ),
        ("{{$func.base64encode($var.unicode)}}", "pässwörd ✓"),
    ],
)
def test_base64encode_encodes_the_text_of_its_argument(placeholder, decoded):
    ctx = make_ctx()
    ctx.var["unicode"] = "pässwörd ✓"
    encoded = render_value(placeholder, ctx)
    assert base64.b64decode(encoded).decode() == decoded


def test_base64encode_of_a_random_value_nests():
    encoded = render_value(
        "{{ $func.base64encode($func.random(string, 12, 'fixed')) }}", make_ctx()
    )
    assert base64.b64decode(encoded).decode() == render_value(
        "{{ $func.random(string, 12, 'fixed') }}", make_ctx()
    )


# --- $func.random ---------------------------------------------------------------------------


@pytest.mark.parametrize("length", [1, 8, 32, 100])
@pytest.mark.parametrize("seed", ["", ", 'fixed'", ", $sys.deterministicSeedValue"])
def test_random_has_the_requested_length_and_lowercase_alphanumerics(length, seed):
    value = render_value(f"{{{{ $func.random(string, {length}{seed}) }}}}", make_ctx())
    assert len(value) == length
    assert set(value) <= ALPHABET


def test_seeded_random_is_the_same_for_the_same_seed():
    first = render_value("{{ $func.random(string, 24, $sys.deterministicSeedValue) }}", make_ctx())
    again = render_value("{{ $func.random(string, 24, $sys.deterministicSeedValue) }}", make_ctx())
    literal = render_value("{{ $func.random(string, 24, 'instance-seed') }}", make_ctx())
    assert first == again == literal


def test_seeded_random_differs_between_seeds_and_lengths():
    one = render_value("{{ $func.random(string, 24, seedone) }}", make_ctx())
    two = render_value("{{ $func.random(string, 24, seedtwo) }}", make_ctx())
    short = render_value("{{ $func.random(string, 12, seedone) }}", make_ctx())
    assert one != two
    assert not one.startswith(short)


def test_seeded_random_is_stable_across_releases():
    # Seeded values name and protect deployed objects: this must never change.
    assert render_value("{{ $func.random(string, 16, 'opsdeck') }}", make_ctx()) == (
        render_value("{{ $func.random(string, 16, opsdeck) }}", make_ctx())
    )
    assert render_value("{{ $func.random(string, 16, 'opsdeck') }}", make_ctx()) == (
        "py3tvv4qk53ncomr"
    )


def test_seed_in_sys_takes_precedence_over_the_context_seed():
    ctx = make_ctx()
    ctx.sys["deterministicSeedValue"] = "from-sys"
    assert render_value("{{ $func.random(string, 10, $sys.deterministicSeedValue) }}", ctx) == (
        render_value("{{ $func.random(string, 10, 'from-sys') }}", make_ctx())
    )


def test_seeded_random_uses_the_whole_alphabet():
    value = render_value("{{ $func.random(string, 4096, spread) }}", make_ctx())
    assert set(value) == ALPHABET


def test_unseeded_random_varies():
    values = {render_value("{{ $func.random(string, 16) }}", make_ctx()) for _ in range(50)}
    assert len(values) == 50


def test_random_with_no_seed_available_is_an_error():
    with pytest.raises(RenderError, match=r"undefined reference \$sys\.deterministicSeedValue"):
        render_value(
            "{{ $func.random(string, 8, $sys.deterministicSeedValue) }}", make_ctx(seed="")
        )
    with pytest.raises(RenderError, match=r"seed of \$func\.random is empty"):
        render_value("{{ $func.random(string, 8, '') }}", make_ctx())


# --- subnets --------------------------------------------------------------------------------


def test_subnet_index_and_star_forms():
    template = (
        "first: {{ $sys.deploymentCell.publicSubnetIDs[0].id }}\n"
        "last: {{ $sys.deploymentCell.publicSubnetIDs[2].id }}\n"
        "all: {{ $sys.deploymentCell.publicSubnetIDs[*].id }}\n"
        "quoted: '{{ $sys.deploymentCell.publicSubnetIDs[*].id }}'\n"
        "none: {{ $sys.deploymentCell.privateSubnetIDs[*].id }}\n"
        "in: subnets=[{{ $sys.deploymentCell.publicSubnetIDs[*].id }}]\n"
    )
    assert render_manifest(template, make_ctx()) == {
        "first": "subnet-a",
        "last": "subnet-c",
        "all": "subnet-a,subnet-b,subnet-c",
        "quoted": "subnet-a,subnet-b,subnet-c",
        "none": "",
        "in": "subnets=[subnet-a,subnet-b,subnet-c]",
    }


def test_star_over_plain_values_and_nested_lists():
    ctx = make_ctx(sys={"zones": ["a", "b"], "cells": [{"ids": [1.0, 2]}, {"ids": [3]}]})
    assert render_value("{{ $sys.zones[*] }}", ctx) == "a,b"
    assert render_value("{{ $sys.cells[*].ids[*] }}", ctx) == "1,2,3"
    assert render_value("$sys.zones[1]", ctx) == "b"


# --- Argo references ------------------------------------------------------------------------


def test_argo_references_render_in_manifests_with_or_without_spaces():
    ctx = make_ctx(
        inputs={"ns": "inst-abc12345", "replicas": 2.0},
        workflow={"mode": "fast", "status": "Succeeded"},
        tasks={"create-cluster": {"phase": "Cluster in healthy state"}},
    )
    template = (
        "metadata:\n  namespace: {{inputs.parameters.ns}}\n"
        "spec:\n  instances: {{ inputs.parameters.replicas }}\n"
        "  mode: {{workflow.parameters.mode}}\n  result: {{ workflow.status }}\n"
        "  note: phase={{tasks.create-cluster.outputs.parameters.phase}}\n"
    )
    assert render_manifest(template, ctx) == {
        "metadata": {"namespace": "inst-abc12345"},
        "spec": {
            "instances": 2,
            "mode": "fast",
            "result": "Succeeded",
            "note": "phase=Cluster in healthy state",
        },
    }


def test_item_of_a_with_items_fan_out_renders_whole_and_by_key():
    ctx = make_ctx(item={"name": "db-1", "size": 10.0})
    assert render_value("{{item}}", ctx) == {"name": "db-1", "size": 10}
    assert render_value("{{ item.name }}-{{ item.size }}", ctx) == "db-1-10"
    assert render_value("{{item}}", make_ctx(item="plain")) == "plain"


def test_item_outside_a_fan_out_is_undefined():
    with pytest.raises(RenderError, match=r"undefined reference \{\{ item \}\}"):
        render_value("{{ item }}", make_ctx())


def test_argument_value_keeps_its_type_when_threaded():
    arguments = [
        {"name": "ns", "value": "{{ $sys.namespace }}"},
        {"name": "instances", "value": "{{ $var.numberOfInstances }}"},
        {"name": "label", "value": "db-{{ $var.numberOfInstances }}"},
        {"name": "plain", "value": 5},
    ]
    assert render_value(arguments, make_ctx()) == [
        {"name": "ns", "value": "inst-abc12345"},
        {"name": "instances", "value": 3},
        {"name": "label", "value": "db-3"},
        {"name": "plain", "value": 5},
    ]


def test_render_value_never_parses_yaml_and_does_not_mutate_its_input():
    value = {"{{ $var.k }}": ["{{ $var.v }}", "a: {{ $var.v }}"], "n": 1.0}
    original = copy.deepcopy(value)
    rendered = render_value(value, with_var(k="key", v="x: y\nz: w"))
    assert rendered == {"key": ["x: y\nz: w", "a: x: y\nz: w"], "n": 1.0}
    assert value == original


def test_render_text_interpolates_every_placeholder_as_text():
    ctx = make_ctx(tasks={"a": {"x": "yes", "n": 2.0, "ok": True}})
    assert render_text("{{tasks.a.outputs.parameters.x}} == yes", ctx) == "yes == yes"
    assert render_text("{{ tasks.a.outputs.parameters.n }}", ctx) == "2"
    assert render_text("{{ tasks.a.outputs.parameters.ok }}", ctx) == "true"
    assert render_text("$var.numberOfInstances", ctx) == "3"
    assert render_text("no placeholders here", ctx) == "no placeholders here"


def test_render_text_reads_a_parsed_non_string_as_its_text():
    assert render_text(True, make_ctx()) == "true"  # type: ignore[arg-type]
    assert render_text(3.0, make_ctx()) == "3"  # type: ignore[arg-type]


def test_when_value_that_is_one_placeholder_keeps_its_type():
    ctx = make_ctx(inputs={"enabled": False})
    assert render_value("{{ inputs.parameters.enabled }}", ctx) is False
    assert render_value("{{ inputs.parameters.enabled }} == true", ctx) == "false == true"


# --- references() ---------------------------------------------------------------------------


def test_references_lists_each_reference_once_in_order():
    template = (
        "a: {{ $var.instances }}\nb: {{inputs.parameters.ns}}-{{ $var.instances }}\n"
        "c: {{tasks.a.outputs.parameters.p}}\nd: {{ workflow.status }}\n"
        "e: {{ workflow.parameters.w }}\nf: {{ $secret.KEY }}\ng: {{ item.name }}\n"
    )
    assert references(template) == [
        "$var.instances",
        "inputs.parameters.ns",
        "tasks.a.outputs.parameters.p",
        "workflow.status",
        "workflow.parameters.w",
        "$secret.KEY",
        "item.name",
    ]


def test_references_include_function_arguments_but_not_literals():
    template = (
        "p: {{ $func.base64encode($var.password) }}\n"
        "q: {{ $func.random(string, 8, $sys.deterministicSeedValue) }}\n"
        "r: {{ $func.random(string, 8) }}\ns: {{ $func.base64encode('literal') }}\n"
    )
    assert references(template) == ["$var.password", "$sys.deterministicSeedValue"]


def test_references_find_bare_whole_values_only():
    template = (
        "host: $sys.network.externalClusterEndpoint\nq: '$var.quoted'\n"
        "list: [$var.inlist]\nnot: reader-$sys.id\n$var.key: 1\n"
    )
    assert references(template) == [
        "$sys.network.externalClusterEndpoint",
        "$var.quoted",
        "$var.inlist",
    ]


def test_references_of_plain_strings_and_when_expressions():
    assert references("$sys.network.externalClusterEndpoint") == [
        "$sys.network.externalClusterEndpoint"
    ]
    assert references("reader-{{ $sys.id }}") == ["$sys.id"]
    assert references("{{tasks.a.outputs.parameters.x}} == yes: {no") == [
        "tasks.a.outputs.parameters.x"
    ]
    assert references("$var.x == 3") == []
    assert references("plain text") == []


def test_references_keep_list_forms():
    template = (
        "a: {{ $sys.deploymentCell.publicSubnetIDs[0].id }}\n"
        "b: {{ $sys.deploymentCell.privateSubnetIDs[*].id }}\n"
    )
    assert references(template) == [
        "$sys.deploymentCell.publicSubnetIDs[0].id",
        "$sys.deploymentCell.privateSubnetIDs[*].id",
    ]


def test_every_reported_reference_is_what_rendering_needs():
    template = spec_templates("postgres-paas-operator-byoa-spec.yaml")[0]
    ctx = make_ctx()
    for ref in references(template):
        root, _, key = ref.partition(".")
        broken = copy.deepcopy(ctx)
        getattr(broken, root.lstrip("$")).pop(key.split(".")[0].split("[")[0])
        with pytest.raises(RenderError, match="undefined reference"):
            render_manifest(template, broken)
