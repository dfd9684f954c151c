"""Argo's `when` (after substitution) and enhanced `depends` expressions."""

import time

import pytest

from deployments.workflow.expressions import (
    TASK_RESULTS,
    ExpressionError,
    check_when_syntax,
    depends_from_dependencies,
    parse_depends,
    parse_when,
    when_is_true,
)

RESULTS = ("Succeeded", "Failed", "Errored", "Skipped", "Omitted", "Daemoned")

# --- when: values --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true", True),
        ("false", False),
        ("", True),
        ("   ", True),
        ("(true)", True),
    ],
)
def test_boolean_literals_and_an_empty_when(text, expected):
    assert when_is_true(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("yes == yes", True),
        ("yes == no", False),
        ("yes != no", True),
        ("my-db == my-db", True),
        ("v1.2.3 == v1.2.3", True),
        ("10Gi != 20Gi", True),
        ("Succeeded == Succeeded", True),
        ("Succeeded == succeeded", False),
    ],
)
def test_bare_words_are_strings(text, expected):
    assert when_is_true(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("'yes' == yes", True),
        ("\"yes\" == 'yes'", True),
        ("'read only' == \"read only\"", True),
        ("'a == b' == 'a == b'", True),
        ("'' == \"\"", True),
        ("'it\\'s' == \"it's\"", True),
        ("'(x)' != '(y)'", True),
    ],
)
def test_quoted_strings_may_hold_spaces_operators_and_escaped_quotes(text, expected):
    assert when_is_true(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10 > 9", True),  # as strings "10" < "9"
        ("3 == 3.0", True),
        ("03 == 3", True),
        ("-1 < 0", True),
        ("1e3 == 1000", True),
        ("2.5 >= 2.5", True),
        ("2.5 <= 2.4", False),
        ("3 < 2", False),
        ("3 != 3.0", False),
    ],
)
def test_numbers_compare_numerically_when_both_sides_are_numbers(text, expected):
    assert when_is_true(text) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("'10' > '9'", False),
        ("abc < abd", True),
        ("b >= a", True),
        ("'3' == 3", False),
        ("'3' != 3", True),
        ("true == 'true'", False),
        ("true != 'true'", True),
        ("1 == true", False),
    ],
)
def test_quoted_numbers_are_strings_and_types_never_equal_each_other(text, expected):
    assert when_is_true(text) is expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "3 < abc",
            'cannot evaluate when "3 < abc": cannot compare 3 < "abc": '
            "both sides must be numbers or both strings",
        ),
        (
            "true > false",
            'cannot evaluate when "true > false": cannot compare true > false: '
            "both sides must be numbers or both strings",
        ),
        (
            "1 < 2 < 3",
            'cannot evaluate when "1 < 2 < 3": cannot compare true < 3: '
            "both sides must be numbers or both strings",
        ),
    ],
)
def test_ordering_across_types_is_an_evaluation_error(text, message):
    expression = parse_when(text)  # the syntax is fine; only the values do not fit
    with pytest.raises(ExpressionError) as info:
        expression.evaluate()
    assert str(info.value) == message


# --- when: operators and precedence ------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("true && true", True),
        ("true && false", False),
        ("false || true", True),
        ("false || false", False),
        ("!false", True),
        ("!!true", True),
        ("a == a && b == b", True),
        ("a == b || b == b", True),
    ],
)
def test_logical_operators(text, expected):
    assert when_is_true(text) is expected


def test_and_binds_tighter_than_or():
    assert when_is_true("true || false && false") is True
    assert when_is_true("false && false || true") is True
    assert when_is_true("(true || false) && false") is False


def test_comparison_binds_tighter_than_and():
    # Were && tighter, "a && b" would be a type error.
    assert when_is_true("a == a && b != c") is True


def test_not_binds_tighter_than_comparison():
    # "!x == y" is "(!x) == y", and "!" needs a boolean.
    with pytest.raises(ExpressionError, match='"!" needs a boolean, got "x"'):
        when_is_true("!x == y")
    assert when_is_true("!(x == y)") is True
    assert when_is_true("!true == false") is True


def test_and_and_or_short_circuit_on_the_deciding_boolean_only():
    assert when_is_true("false && yes") is False
    assert when_is_true("true || yes") is True
    with pytest.raises(ExpressionError, match='"&&" needs booleans, got "yes"'):
        when_is_true("true && yes")
    with pytest.raises(ExpressionError, match='"&&" needs booleans, got "yes"'):
        when_is_true("yes && false")
    with pytest.raises(ExpressionError, match='"\\|\\|" needs booleans, got 3'):
        when_is_true("false || 3")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("yes", 'when "yes" must be true or false, but it is "yes"'),
        ("3", 'when "3" must be true or false, but it is 3'),
        ("1.5", 'when "1.5" must be true or false, but it is 1.5'),
        ("'true'", 'when "\'true\'" must be true or false, but it is "true"'),
        ("True", 'when "True" must be true or false, but it is "True"'),
    ],
)
def test_a_when_that_is_not_boolean_is_an_evaluation_error(text, message):
    with pytest.raises(ExpressionError) as info:
        when_is_true(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a ==", 'invalid when "a ==": expected a value, found the end of the expression'),
        ("== a", 'invalid when "== a": expected a value, found "=="'),
        ("(a == b", 'invalid when "(a == b": missing ")", found the end of the expression'),
        ("a == b)", 'invalid when "a == b)": unexpected ")"'),
        ("()", 'invalid when "()": expected a value, found ")"'),
        ("a = b", 'invalid when "a = b": unknown operator "="; did you mean "=="?'),
        ("a & b", 'invalid when "a & b": unknown operator "&"; did you mean "&&"?'),
        ("a | b", 'invalid when "a | b": unknown operator "|"; did you mean "||"?'),
        ("'abc == abc", "invalid when \"'abc == abc\": unterminated string 'abc == abc"),
        (
            "hello world == yes",
            'invalid when "hello world == yes": unexpected "world"; quote a value that has spaces',
        ),
        ("a == b c", 'invalid when "a == b c": unexpected "c"; quote a value that has spaces'),
        ("a b", 'invalid when "a b": unexpected "b"; quote a value that has spaces'),
        ("!", 'invalid when "!": expected a value, found the end of the expression'),
        ("true &&", 'invalid when "true &&": expected a value, found the end of the expression'),
    ],
)
def test_bad_when_syntax_is_rejected_at_parse(text, message):
    with pytest.raises(ExpressionError) as info:
        parse_when(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    "text",
    ["__import__('os').system('true')", "open('/etc/passwd') == x", "1 + 1 == 2"],
)
def test_python_is_never_evaluated(text):
    with pytest.raises(ExpressionError):
        when_is_true(text)


def test_python_looking_literals_are_plain_words():
    # Python would find [1] == [1.0]; here they are two different strings.
    assert when_is_true("[1] == [1]") is True
    assert when_is_true("[1] == [1.0]") is False
    assert when_is_true("None == None") is True


def test_a_parsed_when_keeps_its_text_and_evaluates_repeatedly():
    expression = parse_when("a != b")
    assert expression.text == "a != b"
    assert expression.evaluate() is True
    assert expression.evaluate() is True


# --- when: checking before substitution ----------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "{{tasks.a.outputs.parameters.x}} == yes",
        "{{ inputs.parameters.mode }} != 'read only'",
        "'{{workflow.status}}' == Succeeded",
        "{{x}}-suffix == a-suffix",
        "{{=sprig.trim(inputs.parameters.x)}} == 'a'",
        "{{a}} > 3 && ({{b}} == x || !{{c}})",
        "",
    ],
)
def test_when_syntax_with_placeholders_is_accepted(text):
    check_when_syntax(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{{x}} ==",
            'invalid when "{{x}} ==": expected a value, found the end of the expression',
        ),
        ("{{x}} = y", 'invalid when "{{x}} = y": unknown operator "="; did you mean "=="?'),
        (
            "{{x}} {{y}} == z",
            'invalid when "{{x}} {{y}} == z": unexpected "{{…}}"; quote a value that has spaces',
        ),
        ("{{x == y", 'invalid when "{{x == y": a "{{" placeholder is not closed'),
        ("{{a}} == b {{c", 'invalid when "{{a}} == b {{c": a "{{" placeholder is not closed'),
    ],
)
def test_bad_when_syntax_is_caught_before_substitution(text, message):
    with pytest.raises(ExpressionError) as info:
        check_when_syntax(text)
    assert str(info.value) == message


# --- depends ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        ("Succeeded", True),
        ("Skipped", True),
        ("Daemoned", True),
        ("Failed", False),
        ("Errored", False),
        ("Omitted", False),
    ],
)
def test_a_bare_name_means_succeeded_skipped_or_daemoned(result, expected):
    assert parse_depends("a").evaluate({"a": result}) is expected


@pytest.mark.parametrize("wanted", RESULTS)
@pytest.mark.parametrize("actual", RESULTS)
def test_a_task_result_operand_is_true_only_for_that_result(wanted, actual):
    assert parse_depends(f"a.{wanted}").evaluate({"a": actual}) is (wanted == actual)


@pytest.mark.parametrize(
    ("children", "any_succeeded", "all_failed"),
    [
        (["Failed", "Succeeded"], True, False),
        (["Succeeded", "Succeeded"], True, False),
        (["Failed", "Failed"], False, True),
        (["Failed", "Errored"], False, False),
        (["Skipped"], False, False),
        ([], False, False),
    ],
)
def test_group_results_read_the_children_of_a_fanned_out_task(children, any_succeeded, all_failed):
    results = {"fan": "Failed"}
    groups = {"fan": children}
    assert parse_depends("fan.AnySucceeded").evaluate(results, groups) is any_succeeded
    assert parse_depends("fan.AllFailed").evaluate(results, groups) is all_failed


def test_group_results_are_false_for_a_task_that_did_not_fan_out():
    assert parse_depends("a.AnySucceeded").evaluate({"a": "Succeeded"}) is False
    assert parse_depends("a.AllFailed").evaluate({"a": "Failed"}, {"other": ["Failed"]}) is False


def test_depends_combines_with_and_or_not_and_parentheses():
    results = {"a": "Succeeded", "b": "Failed", "c": "Skipped"}
    assert parse_depends("a && b.Failed").evaluate(results) is True
    assert parse_depends("a && b").evaluate(results) is False
    assert parse_depends("b || c").evaluate(results) is True
    assert parse_depends("!b").evaluate(results) is True
    assert parse_depends("!(a && c)").evaluate(results) is False
    assert parse_depends("a && (b.Succeeded || c.Skipped)").evaluate(results) is True


def test_depends_and_binds_tighter_than_or():
    results = {"a": "Succeeded", "b": "Failed", "c": "Failed"}
    # "a || b && c" is "a || (b && c)": true; left to right it would be false.
    assert parse_depends("a || b && c").evaluate(results) is True
    assert parse_depends("(a || b) && c").evaluate(results) is False


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("a-b.Succeeded", {"a-b"}),
        ("a-b", {"a-b"}),
        ("task_1 && 2nd-task.Failed", {"task_1", "2nd-task"}),
        ("A && (b.Failed || c-1.AllFailed) && !d", {"A", "b", "c-1", "d"}),
        ("a&&b||c", {"a", "b", "c"}),
        ("a && a.Failed", {"a"}),
    ],
)
def test_task_names_may_hold_hyphens_underscores_and_digits(text, names):
    assert parse_depends(text).task_names() == names


def test_a_hyphenated_name_is_one_task_not_a_subtraction():
    results = {"a-b": "Succeeded", "a": "Failed", "b": "Failed"}
    assert parse_depends("a-b").evaluate(results) is True


def test_an_empty_depends_has_no_tasks_and_is_true():
    expression = parse_depends("")
    assert expression.task_names() == set()
    assert expression.evaluate({}) is True
    assert parse_depends("   ").evaluate({}) is True


def test_evaluating_a_task_without_a_result_is_an_error():
    with pytest.raises(ExpressionError) as info:
        parse_depends("a && b").evaluate({"a": "Succeeded"})
    assert str(info.value) == 'cannot evaluate depends "a && b": task "b" has no result yet'


def test_every_argo_task_result_is_known():
    assert set(TASK_RESULTS) == {*RESULTS, "AnySucceeded", "AllFailed"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "a.Foo",
            'invalid depends "a.Foo": unknown task result "Foo" of task "a"; use one of '
            "Succeeded, Failed, Errored, Skipped, Omitted, Daemoned, AnySucceeded, AllFailed",
        ),
        (
            "a.succeeded",
            'invalid depends "a.succeeded": unknown task result "succeeded" of task "a"; use '
            "one of Succeeded, Failed, Errored, Skipped, Omitted, Daemoned, AnySucceeded, "
            "AllFailed",
        ),
        ("a.", 'invalid depends "a.": expected a task result after "a."'),
        ("a &&", 'invalid depends "a &&": expected a task, found the end of the expression'),
        ("(a", 'invalid depends "(a": missing ")", found the end of the expression'),
        ("a)", 'invalid depends "a)": unexpected ")"'),
        ("a b", 'invalid depends "a b": unexpected "b"'),
        ("a & b", 'invalid depends "a & b": unexpected "&"'),
        ("a - b", 'invalid depends "a - b": unexpected "-"'),
        ("a || || b", 'invalid depends "a || || b": expected a task, found "||"'),
        ("!", 'invalid depends "!": expected a task, found the end of the expression'),
        ("a.Succeeded.x", 'invalid depends "a.Succeeded.x": unexpected "."'),
        ("a == b", 'invalid depends "a == b": unexpected "="'),
    ],
)
def test_bad_depends_is_rejected_with_a_message_naming_the_problem(text, message):
    with pytest.raises(ExpressionError) as info:
        parse_depends(text)
    assert str(info.value) == message


# --- dependencies and continueOn ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("names", "continue_on", "text"),
    [
        ([], {}, ""),
        (["a"], {}, "(a.Succeeded || a.Skipped || a.Daemoned)"),
        (
            ["a", "b-c"],
            {},
            "(a.Succeeded || a.Skipped || a.Daemoned) && "
            "(b-c.Succeeded || b-c.Skipped || b-c.Daemoned)",
        ),
        (["a"], {"a": {"failed": True}}, "(a.Succeeded || a.Skipped || a.Daemoned || a.Failed)"),
        (["a"], {"a": {"error": True}}, "(a.Succeeded || a.Skipped || a.Daemoned || a.Errored)"),
        (
            ["a"],
            {"a": {"failed": True, "error": True}},
            "(a.Succeeded || a.Skipped || a.Daemoned || a.Errored || a.Failed)",
        ),
        (
            ["a"],
            {"a": {"failed": False}, "b": {"failed": True}},
            "(a.Succeeded || a.Skipped || a.Daemoned)",
        ),
    ],
)
def test_dependencies_expand_as_argo_expands_them(names, continue_on, text):
    assert depends_from_dependencies(names, continue_on) == text


@pytest.mark.parametrize(
    ("continue_on", "result", "expected"),
    [
        ({}, "Failed", False),
        ({"a": {"failed": True}}, "Failed", True),
        ({"a": {"failed": True}}, "Errored", False),
        ({"a": {"error": True}}, "Errored", True),
        ({"a": {"error": True}}, "Failed", False),
        ({"a": {"error": True}}, "Omitted", False),
    ],
)
def test_continue_on_lets_a_failed_or_errored_dependency_through(continue_on, result, expected):
    text = depends_from_dependencies(["a", "b"], continue_on)
    assert parse_depends(text).evaluate({"a": result, "b": "Succeeded"}) is expected


def test_a_bare_name_in_depends_honours_the_tasks_continue_on():
    continue_on = {"a": {"failed": True}}
    assert parse_depends("a && b", continue_on).evaluate({"a": "Failed", "b": "Succeeded"})
    assert not parse_depends("a.Succeeded", continue_on).evaluate({"a": "Failed"})
    assert not parse_depends("a && b").evaluate({"a": "Failed", "b": "Succeeded"})


# --- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("check", "text"),
    [
        (check_when_syntax, "(" * 3000 + "true" + ")" * 3000),
        (parse_when, " && ".join(["true"] * 5000)),
        (parse_depends, " && ".join(["a"] * 5000)),
    ],
)
def test_an_expression_nested_beyond_the_stack_is_refused_with_a_reason(check, text):
    # Evaluated, each would have run out of Python's stack: a RecursionError, a 500 at load.
    with pytest.raises(ExpressionError, match=r"nested more than 200 levels deep$"):
        check(text)


def test_a_long_chain_within_the_bound_still_works():
    assert when_is_true(" && ".join(["true"] * 150))
    assert parse_depends(" && ".join(f"t{i}" for i in range(150))).task_names() == {
        f"t{i}" for i in range(150)
    }


def test_many_unclosed_placeholders_are_refused_at_once():
    # Scanned again from each "{{" to the end, 40,000 of them took most of a minute.
    started = time.monotonic()

    with pytest.raises(ExpressionError, match=r'a "\{\{" placeholder is not closed$'):
        check_when_syntax("{{" * 40000)

    assert time.monotonic() - started < 5


def test_an_error_about_a_long_when_quotes_its_beginning_and_says_how_long_it_is():
    text = "1 == 1 && " * 10 + "garbage $$$" + " x" * 20_000

    with pytest.raises(ExpressionError) as caught:
        check_when_syntax(text)

    message = str(caught.value)
    assert message.startswith(f'invalid when "{text[:200]}…" ({len(text):,} characters): ')
    assert len(message) < 400
