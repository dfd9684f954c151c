"""Output extraction: kubectl-style JSONPath, Omnistrate resource paths and Go-style value text."""

import time

import pytest

from deployments.workflow.outputs import (
    MISSING,
    OutputError,
    check_jq_filter,
    check_json_path,
    crd_path,
    dotted_get,
    go_float,
    go_json,
    json_path,
    render_value,
    resource_path,
)

CLUSTER = {
    "apiVersion": "postgresql.cnpg.io/v1",
    "kind": "Cluster",
    "metadata": {
        "name": "inst-abc12345",
        "labels": {"app.kubernetes.io/name": "postgres", "tier": "gold"},
    },
    "spec": {"instances": 3, "storage": {"size": "1Gi"}},
    "status": {
        "phase": "Cluster in healthy state",
        "readyInstances": 3,
        "ratio": 1.5,
        "whole": 2.0,
        "large": 1234567.5,
        "ready": True,
        "note": None,
        "image": "ghcr.io/cloudnative-pg/postgresql:16",
        "instanceNames": ["inst-abc12345-1", "inst-abc12345-2"],
        "certificates": {"expirations": {"b": "2027", "a": "<2026>"}},
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "ClusterIsReady"},
            {"type": "ContinuousArchiving", "status": "False"},
            {"status": "Unknown"},
        ],
    },
}


# --- JSONPath forms ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    ["{.status.phase}", ".status.phase", "$.status.phase", "{$.status.phase}", "status.phase"],
)
def test_every_accepted_path_form_reads_the_same_field(expr):
    assert json_path(CLUSTER, expr) == "Cluster in healthy state"


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ('{.status.conditions[?(@.type=="Ready")].status}', "True"),
        ("{.status.conditions[?(@.type=='Ready')].status}", "True"),
        ('{.status.conditions[?(@.type == "ContinuousArchiving")].status}', "False"),
        ('{.status.conditions[?(@.type!="Ready")].type}', "ContinuousArchiving"),
        ('{.status.conditions[?(@.type=="Ready")].reason}', "ClusterIsReady"),
        ('{.status.conditions[?(@.type=="Missing")].status}', ""),
        ("{.status.conditions[?(@.reason)].type}", "Ready"),
    ],
)
def test_filters_select_list_items_by_a_field(expr, text):
    assert json_path(CLUSTER, expr) == text


def test_a_numeric_filter_compares_numbers():
    obj = {"items": [{"n": 1, "name": "one"}, {"n": 3, "name": "three"}]}
    assert json_path(obj, "{.items[?(@.n>2)].name}") == "three"
    assert json_path(obj, "{.items[?(@.n==1)].name}") == "one"


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("{.status.conditions[*].status}", "True False Unknown"),
        ("{.status.instanceNames[*]}", "inst-abc12345-1 inst-abc12345-2"),
        ("{.status.conditions[*].type}", "Ready ContinuousArchiving"),
        ("{.status.conditions[0:2].status}", "True False"),
        ("{.status.conditions[0,2].status}", "True Unknown"),
    ],
)
def test_several_matches_are_joined_by_one_space(expr, text):
    assert json_path(CLUSTER, expr) == text


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("{.status.conditions[0].type}", "Ready"),
        ("{.status.conditions[-1].status}", "Unknown"),
        ("{.status.instanceNames[1]}", "inst-abc12345-2"),
        ("{..reason}", "ClusterIsReady"),
    ],
)
def test_indexes_slices_and_recursive_descent(expr, text):
    assert json_path(CLUSTER, expr) == text


@pytest.mark.parametrize(
    "expr",
    [
        "{.status.missing}",
        "{.spec.missing.deeper}",
        "{.status.conditions[9].type}",
        "{.status.phase.length}",
        "{.status.phase[0]}",
        '{.status.phase[?(@.type=="Ready")]}',
        '{.missing[?(@.type=="Ready")].status}',
    ],
)
def test_a_missing_path_renders_empty(expr):
    assert json_path(CLUSTER, expr) == ""


def test_escaped_dots_and_quoted_brackets_address_keys_with_dots():
    assert json_path(CLUSTER, r"{.metadata.labels.app\.kubernetes\.io/name}") == "postgres"
    assert json_path(CLUSTER, "{.metadata.labels['app.kubernetes.io/name']}") == "postgres"
    assert json_path(CLUSTER, '{.metadata.labels["app.kubernetes.io/name"]}') == "postgres"


def test_keys_named_like_jsonpath_words_are_plain_keys():
    obj = {"status": {"keys": "k", "len": "l", "this": "t", "parent": "p"}}
    assert json_path(obj, "{.status.keys} {.status.len} {.status.this} {.status.parent}") == (
        "k l t p"
    )


def test_a_template_mixes_literal_text_and_paths():
    expr = 'phase={.status.phase}{"\\n"}ready={.status.readyInstances}'
    assert json_path(CLUSTER, expr) == "phase=Cluster in healthy state\nready=3"


# --- rendering ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ("{.status.readyInstances}", "3"),
        ("{.status.ratio}", "1.5"),
        ("{.status.whole}", "2"),
        ("{.status.large}", "1.2345675e+06"),
        ("{.status.ready}", "true"),
        ("{.status.note}", ""),
        ("{.spec.storage}", '{"size":"1Gi"}'),
        ("{.status.instanceNames}", '["inst-abc12345-1","inst-abc12345-2"]'),
        (
            "{.status.certificates}",
            '{"expirations":{"a":"\\u003c2026\\u003e","b":"2027"}}',
        ),
        (
            '{.status.conditions[?(@.type=="ContinuousArchiving")]}',
            '{"status":"False","type":"ContinuousArchiving"}',
        ),
    ],
)
def test_results_render_as_kubectl_prints_them(expr, text):
    assert json_path(CLUSTER, expr) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("raw text", "raw text"),
        ("", ""),
        (7, "7"),
        (-7, "-7"),
        (2**70, str(2**70)),
        (1.5, "1.5"),
        (3.0, "3"),
        (-0.25, "-0.25"),
        (123456.0, "123456"),
        (1234567.5, "1.2345675e+06"),
        (1e20, "1e+20"),
        (0.00001, "1e-05"),
        (0.0001, "0.0001"),
        (True, "true"),
        (False, "false"),
        (None, ""),
        ({"z": 1, "a": [True, None]}, '{"a":[true,null],"z":1}'),
        ([], "[]"),
        ({}, "{}"),
    ],
)
def test_render_value_gives_kubectl_text_for_each_json_type(value, text):
    assert render_value(value) == text


# --- Go text -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fmt", "text"),
    [
        (1.5, "f", "1.5"),
        (2.0, "f", "2"),
        (1e21, "f", "1000000000000000000000"),
        (1e-7, "f", "0.0000001"),
        (-2.5, "f", "-2.5"),
        (0.1 + 0.2, "f", "0.30000000000000004"),
        (0.0, "f", "0"),
        (-0.0, "f", "-0"),
        (1.5, "e", "1.5e+00"),
        (1e-7, "e", "1e-07"),
        (123.0, "e", "1.23e+02"),
        (0.0, "e", "0e+00"),
        (999999.0, "g", "999999"),
        (1234567.0, "g", "1.234567e+06"),
        (0.0001, "g", "0.0001"),
        (0.00001, "g", "1e-05"),
        (float("nan"), "f", "NaN"),
        (float("inf"), "g", "+Inf"),
        (float("-inf"), "e", "-Inf"),
    ],
)
def test_go_float_matches_strconv_format_float_shortest(value, fmt, text):
    assert go_float(value, fmt) == text


def test_go_float_rejects_an_unknown_format():
    with pytest.raises(ValueError, match="unsupported float format"):
        go_float(1.0, "x")


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "null"),
        (True, "true"),
        (3, "3"),
        (1.0, "1"),
        (1.5, "1.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (0.000001, "0.000001"),
        ("plain", '"plain"'),
        ('quote " and \\ slash', '"quote \\" and \\\\ slash"'),
        ("\n\t\r\b\f", '"\\n\\t\\r\\b\\f"'),
        ("\x01\x1f", '"\\u0001\\u001f"'),
        ("<a href='x'>&</a>", "\"\\u003ca href='x'\\u003e\\u0026\\u003c/a\\u003e\""),
        ("\u2028\u2029", '"\\u2028\\u2029"'),
        ("café ☕", '"café ☕"'),
        ({"b": {"d": 1, "c": 2}, "a": [1, "x"]}, '{"a":[1,"x"],"b":{"c":2,"d":1}}'),
        ((1, 2), "[1,2]"),
    ],
)
def test_go_json_matches_go_json_marshal(value, text):
    assert go_json(value) == text


# --- Omnistrate forms ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        ('$var._crd.status.conditions[?(@.type=="Ready")].status', "True"),
        ("$var._crd.status.phase", "Cluster in healthy state"),
        ("$var._crd.status.image", "ghcr.io/cloudnative-pg/postgresql:16"),
        ("$var._crd.status.readyInstances", "3"),
        ("$var._crd.spec.storage", '{"size":"1Gi"}'),
        ("$var._crd.status.topology", ""),
        ("  $var._crd.status.phase  ", "Cluster in healthy state"),
        ("{.status.phase}", "Cluster in healthy state"),
    ],
)
def test_crd_path_reads_omnistrate_legacy_paths(expr, text):
    assert crd_path(CLUSTER, expr) == text


def test_crd_path_of_the_bare_prefix_is_the_whole_object():
    obj = {"kind": "Cluster", "spec": {"instances": 1}}
    assert crd_path(obj, "$var._crd") == '{"kind":"Cluster","spec":{"instances":1}}'


@pytest.mark.parametrize(
    ("path", "text"),
    [
        ("status.phase", "Cluster in healthy state"),
        ("status.readyInstances", "3"),
        ("status.conditions.0.status", "True"),
        ("status.conditions[1].type", "ContinuousArchiving"),
        ("status.instanceNames.1", "inst-abc12345-2"),
        ("spec.storage", '{"size":"1Gi"}'),
        ("status.ready", "true"),
        ("status.whole", "2"),
        ("status.note", ""),
        ("metadata.name", "inst-abc12345"),
    ],
)
def test_resource_path_reads_dotted_paths(path, text):
    assert resource_path(CLUSTER, path) == text


@pytest.mark.parametrize(
    "path",
    [
        "status.missing",
        "status.conditions.9.type",
        "status.conditions.x.type",
        "status.phase.more",
        "spec.storage.0",
    ],
)
def test_resource_path_is_empty_when_missing(path):
    assert resource_path(CLUSTER, path) == ""


def test_dotted_get_tells_null_from_missing():
    assert dotted_get(CLUSTER, "status.note") is None
    assert dotted_get(CLUSTER, "status.nothing") is MISSING
    assert dotted_get(CLUSTER, "status.instanceNames.0") == "inst-abc12345-1"


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "{.status.phase}",
        ".status.phase",
        "$.status.phase",
        '{.status.conditions[?(@.type=="Ready")].status}',
        "{.items[*].metadata.name}",
        r"{.metadata.annotations.kubectl\.kubernetes\.io/last-applied-configuration}",
        '$var._crd.status.conditions[?(@.type=="Ready")].status',
        'name={.metadata.name}{"\\n"}',
    ],
)
def test_check_json_path_accepts_valid_paths(expr):
    check_json_path(expr)


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty JSONPath"),
        ("   ", "empty JSONPath"),
        ("{.status.phase", 'invalid JSONPath "{.status.phase": missing "}"'),
        (".status.phase}", 'invalid JSONPath ".status.phase}": unmatched "}"'),
        ("{}", 'invalid JSONPath "{}": empty "{}"'),
        (
            '{.status.conditions[?(@.type=="Ready"].status}',
            'invalid JSONPath "{.status.conditions[?(@.type=="Ready"].status}": missing "]"',
        ),
        ("{.status..}", 'invalid JSONPath "{.status..}": a field name is missing'),
        ("{.a b}", 'invalid JSONPath "{.a b}": unexpected " "'),
        (
            "{range .items[*]}{.x}{end}",
            'invalid JSONPath "{range .items[*]}{.x}{end}": range templates are not supported',
        ),
        ('{"\\q"}', 'invalid JSONPath "{"\\q"}": bad quoted text "\\q"'),
    ],
)
def test_check_json_path_rejects_bad_paths_with_a_message(expr, message):
    with pytest.raises(OutputError) as info:
        check_json_path(expr)
    assert str(info.value) == message


def test_check_json_path_reports_jsonpath_ng_parse_errors():
    with pytest.raises(OutputError, match=r'^invalid JSONPath "\{\.status\[\?\(@\.a==\)\]\}": '):
        check_json_path("{.status[?(@.a==)]}")


def test_json_path_raises_for_an_invalid_path():
    with pytest.raises(OutputError):
        json_path(CLUSTER, "{.status.phase")


def test_output_error_is_a_value_error():
    assert issubclass(OutputError, ValueError)


def test_a_jq_filter_with_an_unterminated_string_of_escaped_quotes_is_refused_at_once():
    # Its strings were found by a regular expression that scanned to the end again from every
    # quote: half a minute for these 60 kB.
    started = time.monotonic()

    with pytest.raises(OutputError, match=r"^jq: syntax error"):
        check_jq_filter('.a | "' + '\\"' * 30000)

    assert time.monotonic() - started < 5


@pytest.mark.parametrize(
    "program", ['"home: \\(env.HOME)"', '.a | "\\("nested \\($ENV.PATH)")"', '"\\(input)"']
)
def test_a_builtin_reading_outside_the_object_is_refused_inside_an_interpolation(program):
    with pytest.raises(OutputError, match=r"is not allowed; a filter reads the object only$"):
        check_jq_filter(program)


def test_a_builtins_name_in_a_strings_text_is_only_text():
    check_jq_filter('.a + " env input \\" $ENV " + "\\(.b)"')
