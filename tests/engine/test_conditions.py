"""successCondition / failureCondition: Argo's label-selector rules, and `cel:` conditions."""

import pytest

from deployments.workflow.conditions import (
    FAILED,
    PENDING,
    SUCCEEDED,
    CelCondition,
    ConditionError,
    Requirement,
    SelectorCondition,
    evaluate,
    field_text,
    parse_condition,
)

CLUSTER = {
    "apiVersion": "postgresql.cnpg.io/v1",
    "kind": "Cluster",
    "metadata": {"name": "inst-abc12345", "labels": {"app": "db"}},
    "status": {
        "phase": "Cluster in healthy state",
        "state": "Running",
        "readyInstances": 3,
        "ratio": 1.5,
        "whole": 2.0,
        "huge": 1e21,
        "tiny": 1e-7,
        "ready": True,
        "degraded": False,
        "note": None,
        "count": "7",
        "info": {"b": 1, "a": "x<y>&z"},
        "tags": ["a", "b"],
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "Healthy", "status": "False"},
        ],
    },
}


def matches(condition: str, obj: dict = CLUSTER) -> bool:
    return parse_condition(condition).all_match(obj)


# --- value lookup ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("status.state", "Running"),
        ("status.phase", "Cluster in healthy state"),
        ("status.readyInstances", "3"),
        ("status.ratio", "1.5"),
        ("status.whole", "2"),
        ("status.huge", "1000000000000000000000"),
        ("status.tiny", "0.0000001"),
        ("status.ready", "true"),
        ("status.degraded", "false"),
        ("status.note", ""),
        ("status.count", "7"),
        ("status.info", '{"a":"x\\u003cy\\u003e\\u0026z","b":1}'),
        ("status.tags", '["a","b"]'),
        ("status.conditions.0.status", "True"),
        ("status.conditions.1.type", "Healthy"),
        ("status.tags.1", "b"),
        ("metadata.labels.app", "db"),
    ],
)
def test_field_text_renders_each_json_type_as_argo_compares_it(key, text):
    assert field_text(CLUSTER, key) == text


@pytest.mark.parametrize(
    "key",
    [
        "status.missing",
        "spec.instances",
        "status.conditions.5.type",
        "status.conditions.-1.type",
        "status.conditions.first.type",
        "status.state.length",
        "status.note.inner",
    ],
)
def test_field_text_is_none_for_a_path_that_leads_nowhere(key):
    assert field_text(CLUSTER, key) is None


def test_field_text_of_null_is_empty_but_the_key_exists():
    assert field_text(CLUSTER, "status.note") == ""
    assert matches("status.note")


# --- operator truth table ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        # = and == : false when missing, string equality when present
        ("status.state=Running", True),
        ("status.state=Failed", False),
        ("status.missing=Running", False),
        ("status.state==Running", True),
        ("status.state==Failed", False),
        ("status.missing==Running", False),
        # in : false when missing, membership when present
        ("status.state in (Failed,Running)", True),
        ("status.state in (Failed)", False),
        ("status.missing in (Running)", False),
        # != and notin : TRUE when missing
        ("status.state!=Failed", True),
        ("status.state!=Running", False),
        ("status.missing!=Running", True),
        ("status.state notin (Failed,Stopped)", True),
        ("status.state notin (Running)", False),
        ("status.missing notin (Running)", True),
        # key / !key
        ("status.state", True),
        ("status.missing", False),
        ("!status.missing", True),
        ("!status.state", False),
        # > and < : int64 only, false when missing
        ("status.readyInstances>2", True),
        ("status.readyInstances>3", False),
        ("status.readyInstances<4", True),
        ("status.readyInstances<3", False),
        ("status.missing>0", False),
        ("status.missing<10", False),
    ],
)
def test_each_operator_follows_the_argo_truth_table(condition, expected):
    assert matches(condition) is expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.ratio>1", False),  # "1.5" is not an int64
        ("status.ratio<2", False),
        ("status.whole<3", True),  # a whole float reads as "2"
        ("status.count>6", True),  # a string that holds an integer compares as one
        ("status.ready>0", False),  # "true" is not an integer
        ("status.info>0", False),
    ],
)
def test_greater_and_less_than_compare_int64_and_are_false_for_anything_else(condition, expected):
    assert matches(condition) is expected


def test_greater_than_compares_beyond_32_bits():
    obj = {"status": {"size": 9_000_000_000}}
    assert matches("status.size>8999999999", obj)
    assert not matches("status.size<8999999999", obj)


def test_a_value_beyond_int64_never_compares():
    assert not matches("status.size>1", {"status": {"size": 2**64}})


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.note=", True),
        ("status.note==x", False),
        ("status.note!=x", True),
        ("status.note in ()", True),
        ("status.note in (a,,b)", True),
        ("status.note notin ()", False),
        ("!status.note", False),
    ],
)
def test_null_reads_as_the_empty_value_of_an_existing_key(condition, expected):
    assert matches(condition) is expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.ready==true", True),
        ("status.ready=True", False),
        ("status.degraded=false", True),
        ("status.degraded!=true", True),
        ("status.ready in (true,yes)", True),
    ],
)
def test_booleans_compare_as_the_words_true_and_false(condition, expected):
    assert matches(condition) is expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.readyInstances==3", True),
        ("status.readyInstances==3.0", False),
        ("status.readyInstances==03", False),
        ("status.ratio==1.5", True),
        ("status.whole==2", True),
        ("status.whole==2.0", False),
        ("status.huge==1000000000000000000000", True),
        ("status.tiny==0.0000001", True),
    ],
)
def test_numbers_compare_as_their_argo_text(condition, expected):
    assert matches(condition) is expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.info", True),
        ("status.info==x", False),
        ("status.info!=x", True),
        ("status.info.b==1", True),
        ("status.tags", True),
        ("status.tags notin (a,b)", True),
    ],
)
def test_objects_and_lists_compare_as_json_text_and_nested_keys_are_reachable(condition, expected):
    assert matches(condition) is expected


@pytest.mark.parametrize(
    ("condition", "expected"),
    [
        ("status.conditions.0.status==True", True),
        ("status.conditions.1.type=Healthy", True),
        ("status.conditions.1.status==True", False),
        ("status.conditions.5.type", False),
        ("!status.conditions.5.type", True),
        ("status.conditions.5.type!=Ready", True),
        ("status.tags.0=a", True),
    ],
)
def test_a_numeric_segment_indexes_a_list(condition, expected):
    assert matches(condition) is expected


def test_the_empty_value_matches_only_an_empty_or_null_field():
    assert not matches("status.state=")
    assert matches("status.state!=")
    assert matches("status.text=", {"status": {"text": ""}})


def test_keys_and_values_are_case_sensitive():
    assert not matches("status.state=running")
    assert not matches("Status.state=Running")


def test_whitespace_around_operators_and_values_is_ignored():
    assert matches(" status.state \t== Running ,\n status.readyInstances > 2 ")


def test_a_key_may_carry_a_dns_prefix_before_a_slash_as_gjson_reads_it():
    obj = {"metadata": {"labels": {"example": {"com/tier": "gold"}}}}
    assert matches("metadata.labels.example.com/tier=gold", obj)


# --- combination rules -------------------------------------------------------------------------


def test_success_needs_every_requirement():
    assert evaluate(CLUSTER, "status.state=Running,status.readyInstances=3", None) == SUCCEEDED
    assert evaluate(CLUSTER, "status.state=Running,status.readyInstances=2", None) == PENDING


def test_failure_needs_only_one_requirement():
    # Argo's docs say AND; resource.go fails on the first matching requirement.
    assert evaluate(CLUSTER, None, "status.state=Failed,status.readyInstances=3") == FAILED


def test_failure_is_checked_before_success():
    assert evaluate(CLUSTER, "status.state=Running", "status.readyInstances=3") == FAILED


def test_no_conditions_succeed_at_once():
    assert evaluate(CLUSTER, None, None) == SUCCEEDED
    assert evaluate(CLUSTER, "", "") == SUCCEEDED
    assert evaluate({}, None, None) == SUCCEEDED


def test_only_a_failure_condition_that_does_not_match_succeeds():
    assert evaluate(CLUSTER, None, "status.state=Failed") == SUCCEEDED
    assert evaluate(CLUSTER, "", "status.state=Failed") == SUCCEEDED


def test_only_a_failure_condition_that_matches_fails():
    assert evaluate(CLUSTER, None, "status.state=Running") == FAILED


def test_neither_condition_deciding_leaves_the_task_pending():
    assert evaluate(CLUSTER, "status.readyInstances=4", "status.state=Failed") == PENDING


def test_a_missing_status_keeps_a_success_condition_pending():
    obj = {"metadata": {"name": "x"}}
    assert evaluate(obj, "status.state=Running", "status.state=Failed") == PENDING


def test_a_notin_failure_condition_fails_while_the_field_is_missing():
    # `!=`/`notin` are true for a missing key, so such a failureCondition fires at once.
    assert evaluate({}, "status.state=Running", "status.state notin (Running)") == FAILED


def test_an_empty_selector_matches_all_and_any_of_nothing():
    condition = parse_condition("   ")
    assert condition.all_match(CLUSTER)
    assert not condition.any_match(CLUSTER)


def test_all_match_and_any_match_differ_on_a_partial_match():
    condition = parse_condition("status.state=Running,status.readyInstances=9")
    assert not condition.all_match(CLUSTER)
    assert condition.any_match(CLUSTER)


def test_evaluate_raises_for_an_unparseable_condition_even_if_the_other_decides():
    with pytest.raises(ConditionError):
        evaluate(CLUSTER, "status.state=Cluster in healthy state", "status.state=Running")
    with pytest.raises(ConditionError):
        evaluate(CLUSTER, "status.state=Running", "status.x > 1.5")


# --- parsing -----------------------------------------------------------------------------------


def test_parse_returns_the_requirements_in_written_order():
    condition = parse_condition("status.a=1,!status.b,status.c in (x,y),status.d>2,status.e")
    assert isinstance(condition, SelectorCondition)
    assert condition.requirements == (
        Requirement("status.a", "=", ("1",)),
        Requirement("status.b", "!"),
        Requirement("status.c", "in", ("x", "y")),
        Requirement("status.d", ">", ("2",)),
        Requirement("status.e", "exists"),
    )


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("k in ()", ("",)),
        ("k in (,)", ("",)),
        ("k in (a,)", ("a", "")),
        ("k in (,a)", ("", "a")),
        ("k in (a,,b)", ("a", "", "b")),
        ("k in (a, b ,c)", ("a", "b", "c")),
        ("k in (a,a)", ("a",)),
        ("k in (in,notin)", ("in", "notin")),
    ],
)
def test_value_lists_read_empty_slots_as_the_empty_value(text, values):
    assert parse_condition(text).requirements[0].values == values


@pytest.mark.parametrize(
    ("text", "values"),
    [("k=", ("",)), ("k==,j", ("",)), ("k!=", ("",)), ("k=in", ("in",))],
)
def test_an_exact_match_without_a_value_reads_the_empty_value(text, values):
    assert parse_condition(text).requirements[0].values == values


def test_requirements_print_as_argo_logs_them():
    texts = ["a=1", "a==1", "a!=1", "a in (x,y)", "a notin (x)", "a", "!a", "a>1", "a<1"]
    assert [str(parse_condition(t).requirements[0]) for t in texts] == texts


def test_a_63_character_value_is_accepted_and_64_is_not():
    assert parse_condition("k=" + "v" * 63)
    with pytest.raises(ConditionError):
        parse_condition("k=" + "v" * 64)


@pytest.mark.parametrize(
    "text",
    [
        "status.readyInstances == 3",
        "status.phase == completed",
        "status.clusterInfo.ready == true",
        "status.readyInstances == 3, status.phase == completed",
        "status.readyInstances>0,status.phase!=failed",
        "status.conditions.0.status == True",
        "status.phase in (Succeeded, Completed)",
        "metadata.labels.app.kubernetes.io/name == postgres",
    ],
)
def test_conditions_that_omnistrate_spec_authors_write_parse(text):
    assert parse_condition(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "status.phase == Cluster in healthy state",
            'value "Cluster in healthy state" is not a valid label value; use a cel: condition',
        ),
        (
            'status.phase == "Cluster in healthy state"',
            'value "Cluster in healthy state" is not a valid label value; use a cel: condition',
        ),
        ('status.phase == "True"', 'value "True" must not be quoted; write True'),
        ("status.phase == 'True'", "value 'True' must not be quoted; write True"),
        ('status.phase == ""', 'value "" must not be quoted; write nothing (an empty value)'),
        (
            "status.phase in (Running, Cluster in healthy state)",
            'value "Cluster in healthy state" is not a valid label value; use a cel: condition',
        ),
        ("k=" + "v" * 64, f'value "{"v" * 64}" is not a valid label value; use a cel: condition'),
        ("k=-v", 'value "-v" is not a valid label value; use a cel: condition'),
        ("k=v.", 'value "v." is not a valid label value; use a cel: condition'),
        ("k=a:b", 'value "a:b" is not a valid label value; use a cel: condition'),
        ("k=b c=d", 'value "b c" is not a valid label value; use a cel: condition'),
        ("k in (b c)", 'value "b c" is not a valid label value; use a cel: condition'),
        ("status.x > 1.5", "'>' needs an integer, got \"1.5\""),
        ("status.x < abc", "'<' needs an integer, got \"abc\""),
        ("status.x > ", "'>' needs an integer, got \"\""),
        ("status.x > 99999999999999999999", "'>' needs an integer, got \"99999999999999999999\""),
        ("status.x > -1", 'value "-1" is not a valid label value; use a cel: condition'),
        (
            "status.x >= 3",
            'unknown operator ">=" after key "status.x"; label selectors have '
            "=, ==, !=, in, notin, > and <; use a cel: condition for anything else",
        ),
        (
            "status.x <= 3",
            'unknown operator "<=" after key "status.x"; label selectors have '
            "=, ==, !=, in, notin, > and <; use a cel: condition for anything else",
        ),
        (
            "status.x eq 3",
            'unknown operator "eq" after key "status.x"; label selectors have '
            "=, ==, !=, in, notin, > and <; use a cel: condition for anything else",
        ),
        (
            "status.x IN (a)",
            'unknown operator "IN" after key "status.x"; label selectors have '
            "=, ==, !=, in, notin, > and <; use a cel: condition for anything else",
        ),
        (
            "status.x === 3",
            'unknown operator "===" after key "status.x"; label selectors have '
            "=, ==, !=, in, notin, > and <; use a cel: condition for anything else",
        ),
        (
            "status.conditions[0].status == True",
            'key "status.conditions[0].status" is not a valid condition key: a list item is '
            'addressed with a numeric segment, write "status.conditions.0.status"',
        ),
        (
            'status.conditions[?(@.type=="Ready")].status == True',
            'key "status.conditions[?" is not a valid condition key: a key is a dotted path of '
            "letters, digits, '-', '_' and '.' that starts and ends with a letter or digit; "
            "use a cel: condition",
        ),
        (
            "$var._crd.status.phase == x",
            'key "$var._crd.status.phase" is not a valid condition key: a key is a dotted path '
            "of letters, digits, '-', '_' and '.' that starts and ends with a letter or digit; "
            "use a cel: condition",
        ),
        (
            "k" * 64 + "=v",
            f'key "{"k" * 64}" is not a valid condition key: the key is longer than 63 '
            "characters; use a cel: condition",
        ),
        (
            "a/b/c=d",
            "key \"a/b/c\" is not a valid condition key: a key may contain at most one '/'; "
            "use a cel: condition",
        ),
        (
            "Example.com/x=d",
            "key \"Example.com/x\" is not a valid condition key: the part before '/' must be a "
            "lowercase DNS subdomain; use a cel: condition",
        ),
        ("a=b,", 'expected a requirement after the last ","'),
        (",a=b", 'expected a key, found ","'),
        ("a=b,,c", 'expected a key, found ","'),
        ("=b", 'expected a key, found "="'),
        ("!", 'expected a key after "!", found the end of the condition'),
        ("!a=b", '"!a" takes no operator or value; found "="'),
        ("a=b)", 'unexpected ")" after "a=b"; separate requirements with ","'),
        ("a in (b) c", 'unexpected "c" after "a in (b)"; separate requirements with ","'),
        ("a in b", "'in' needs a list in parentheses, e.g. a in (v1,v2); found \"b\""),
        (
            "a notin",
            "'notin' needs a list in parentheses, e.g. a notin (v1,v2); found the end "
            "of the condition",
        ),
        ("a in (b", 'missing ")" to close the values of "a in"'),
        ("a in (b,(c))", 'unexpected "(" in the values of "a in"'),
        ("a = (b)", 'expected a value after "=", found "("'),
    ],
)
def test_a_bad_condition_is_rejected_with_a_message_naming_the_problem(text, message):
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert str(info.value) == message


def test_condition_error_is_a_value_error():
    assert issubclass(ConditionError, ValueError)


# --- CEL ---------------------------------------------------------------------------------------


def test_a_cel_condition_can_compare_a_value_with_spaces():
    condition = parse_condition('cel: self.status.phase == "Cluster in healthy state"')
    assert isinstance(condition, CelCondition)
    assert condition.all_match(CLUSTER)
    assert condition.any_match(CLUSTER)


def test_a_cel_condition_can_query_the_conditions_array():
    ready = 'cel: self.status.conditions.exists(c, c.type == "Ready" && c.status == "True")'
    healthy = 'cel: self.status.conditions.exists(c, c.type == "Healthy" && c.status == "True")'
    assert evaluate(CLUSTER, ready, None) == SUCCEEDED
    assert evaluate(CLUSTER, healthy, None) == PENDING


def test_a_false_cel_condition_does_not_match():
    condition = parse_condition("cel: self.status.readyInstances > 3")
    assert not condition.all_match(CLUSTER)
    assert not condition.any_match(CLUSTER)


def test_a_cel_condition_over_a_missing_field_is_false_not_an_error():
    condition = parse_condition('cel: self.status.missing == "x"')
    assert not condition.all_match(CLUSTER)
    assert not condition.any_match(CLUSTER)
    assert evaluate({}, 'cel: self.status.phase == "ok"', 'cel: self.status.phase == "bad"') == (
        PENDING
    )


def test_a_cel_failure_condition_fails_the_task():
    assert evaluate(CLUSTER, None, "cel: self.status.readyInstances >= 3") == FAILED


def test_a_cel_condition_that_errors_while_evaluating_is_false():
    assert not matches("cel: self.status.readyInstances / 0 == 1")
    assert not matches("cel: self.status.conditions[9].type == 'Ready'")


def test_a_cel_condition_that_is_not_boolean_is_false():
    assert not matches("cel: self.status.state")
    assert not matches("cel: self.status.readyInstances")


def test_a_cel_condition_sees_json_types():
    assert matches("cel: self.status.readyInstances == 3 && self.status.ready")
    assert matches("cel: self.status.note == null && self.status.ratio > 1.0")
    assert matches("cel: has(self.status.state) && !has(self.spec)")


def test_a_cel_prefix_may_be_preceded_by_blanks():
    assert matches("  cel:self.status.readyInstances == 3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "cel: self.status.phase ==",
            "invalid CEL expression at line 1, column 19: unexpected end of expression\n"
            "self.status.phase ==\n                  ^",
        ),
        (
            'cel: self.x == "a',
            "invalid CEL expression at line 1, column 11: unexpected character '\"'\n"
            'self.x == "a\n          ^',
        ),
        (
            "cel: self.status phase",
            'invalid CEL expression at line 1, column 13: unexpected "phase"\n'
            "self.status phase\n            ^",
        ),
        ("cel:", "a cel: condition needs an expression after 'cel:'"),
        ("cel:   ", "a cel: condition needs an expression after 'cel:'"),
    ],
)
def test_a_cel_syntax_error_is_reported_when_the_condition_is_parsed(text, message):
    with pytest.raises(ConditionError) as info:
        parse_condition(text)
    assert str(info.value) == message
