"""Typed validation of customer input against apiParameters (create and modify)."""

import time

import pytest

from deployments.spec.model import Parameter
from deployments.spec.params import (
    ParameterErrors,
    format_value,
    generate_password,
    validate_parameters,
)


def param(key: str, type_: str = "String", **fields) -> Parameter:
    fields.setdefault("required", False)
    return Parameter(key=key, name=key.title(), description="", type=type_, **fields)


def errors_for(parameters, values, **kwargs) -> dict[str, str]:
    with pytest.raises(ParameterErrors) as caught:
        validate_parameters(parameters, values, **kwargs)
    return caught.value.errors


# --- String -------------------------------------------------------------------------------


def test_string_is_returned_as_given():
    assert validate_parameters([param("db")], {"db": "orders"}) == {"db": "orders"}


def test_string_length_limits():
    db = param("db", limits={"min": 3, "max": 8})

    assert errors_for([db], {"db": "ab"}) == {"db": "Must be between 3 and 8 characters long."}
    assert errors_for([db], {"db": "a" * 9}) == {"db": "Must be between 3 and 8 characters long."}
    assert validate_parameters([db], {"db": "abc"}) == {"db": "abc"}


def test_string_minimum_length_alone():
    assert errors_for([param("db", limits={"min": 3})], {"db": "ab"}) == {
        "db": "Must be at least 3 characters long."
    }


def test_string_regex_must_match_the_whole_value():
    db = param("db", regex="[a-z]+")

    assert errors_for([db], {"db": "orders1"}) == {"db": "Must match the pattern [a-z]+."}
    assert validate_parameters([db], {"db": "orders"}) == {"db": "orders"}


def test_a_regex_refusal_says_the_specs_words_for_the_pattern_when_it_has_them():
    db = param("db", regex="[a-z]+", regex_message="Use lowercase letters.")

    assert errors_for([db], {"db": "orders1"}) == {"db": "Use lowercase letters."}


def test_a_pattern_that_would_backtrack_answers_a_hostile_value_at_once():
    # Python's `re` backtracks through every way to split the letters: about a minute here.
    code = param("code", regex="(a+)+$")
    started = time.monotonic()

    found = errors_for([code], {"code": "a" * 30 + "!"})

    assert time.monotonic() - started < 10
    assert found == {"code": "Must match the pattern (a+)+$."}
    assert validate_parameters([code], {"code": "a" * 30}) == {"code": "a" * 30}


def test_string_options():
    size = param("size", options=["small", "large"])

    assert errors_for([size], {"size": "huge"}) == {"size": "Must be one of: small, large."}
    assert validate_parameters([size], {"size": "large"}) == {"size": "large"}


def test_string_rejects_structured_values():
    assert errors_for([param("db")], {"db": ["a"]}) == {"db": "Must be text."}


# --- Float64 ------------------------------------------------------------------------------


def test_float_from_form_text_with_an_integral_value_is_an_integer():
    result = validate_parameters([param("n", "Float64")], {"n": "3"})

    assert result == {"n": 3}
    assert type(result["n"]) is int
    assert str(result["n"]) == "3"


def test_float_integral_float_input_is_an_integer_too():
    result = validate_parameters([param("n", "Float64")], {"n": 3.0})

    assert type(result["n"]) is int
    assert format_value(param("n", "Float64"), 3.0) == "3"


def test_float_keeps_a_fraction():
    assert validate_parameters([param("n", "Float64")], {"n": "2.5"}) == {"n": 2.5}


@pytest.mark.parametrize(
    "value", ["three", "nan", "inf", True, [1], "1_0", "\u0662\u0660", "0x10", "1e400"]
)  # 1_0 and Arabic-Indic digits are Python's float syntax, not how people write numbers
def test_float_rejects_what_is_not_a_finite_number(value):
    assert errors_for([param("n", "Float64")], {"n": value}) == {"n": "Must be a number."}


def test_float_limits():
    n = param("n", "Float64", limits={"min": 1, "max": 5})

    assert errors_for([n], {"n": "0"}) == {"n": "Must be between 1 and 5."}
    assert errors_for([n], {"n": "5.5"}) == {"n": "Must be between 1 and 5."}
    assert validate_parameters([n], {"n": "5"}) == {"n": 5}


def test_float_one_sided_limits():
    assert errors_for([param("n", "Float64", limits={"min": 1})], {"n": "0"}) == {
        "n": "Must be at least 1."
    }
    assert errors_for([param("n", "Float64", limits={"max": 2.5})], {"n": "3"}) == {
        "n": "Must be at most 2.5."
    }


@pytest.mark.parametrize("value", ["1e30", 10**40, -(2**53) - 2])
def test_a_number_beyond_what_a_double_holds_exactly_is_refused(value):
    # Whole servers with no maximum: 1e30 was a server error (the step's Decimal division).
    servers = param("servers", "Float64", limits={"min": 1}, step=1)

    assert errors_for([servers], {"servers": value}) == {
        "servers": "Must be between -9007199254740992 and 9007199254740992."
    }
    assert validate_parameters([servers], {"servers": 2**53}) == {"servers": 2**53}


def test_a_step_far_below_the_value_is_checked_exactly():
    share = param("share", "Float64", step=0.0000001)

    assert validate_parameters([share], {"share": 2**52 + 0.5}) == {"share": 2**52 + 0.5}
    assert errors_for([share], {"share": "0.00000015"}) == {
        "share": "Must go in steps of 1e-07 from 0."
    }


def test_float_options_compare_the_rendered_number():
    cpu = param("cpu", "Float64", options=["1", "2", "4"])

    assert validate_parameters([cpu], {"cpu": "2.0"}) == {"cpu": 2}
    assert errors_for([cpu], {"cpu": "3"}) == {"cpu": "Must be one of: 1, 2, 4."}


# --- Boolean ------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["true", "on", "1", "yes", "TRUE", True])
def test_boolean_true_spellings(text):
    assert validate_parameters([param("b", "Boolean")], {"b": text}) == {"b": True}


@pytest.mark.parametrize("text", ["false", "off", "0", "no", "False", False])
def test_boolean_false_spellings(text):
    assert validate_parameters([param("b", "Boolean")], {"b": text}) == {"b": False}


def test_boolean_rejects_other_words():
    assert errors_for([param("b", "Boolean")], {"b": "maybe"}) == {"b": "Must be true or false."}


# --- JSON ---------------------------------------------------------------------------------


def test_json_text_is_parsed():
    assert validate_parameters([param("j", "JSON")], {"j": '{"max_connections": "200"}'}) == {
        "j": {"max_connections": "200"}
    }


def test_json_with_a_number_too_long_to_read_says_so_in_words():
    # Python's own words were shown: "Exceeds the limit (4300 digits) for integer string
    # conversion ... use sys.set_int_max_str_digits() to increase the limit".
    assert errors_for([param("js", "JSON")], {"js": '{"max": ' + "9" * 5000 + "}"}) == {
        "js": "Must not hold numbers so long."
    }


def test_json_already_parsed_is_kept():
    assert validate_parameters([param("j", "JSON")], {"j": [1, 2]}) == {"j": [1, 2]}


def test_json_that_does_not_parse():
    assert errors_for([param("j", "JSON")], {"j": "{oops"}) == {
        "j": "Must be valid JSON (Expecting property name enclosed in double quotes at line 1)."
    }


# --- Password -----------------------------------------------------------------------------


def test_missing_password_is_generated():
    first = validate_parameters([param("pw", "Password")], {})["pw"]
    second = validate_parameters([param("pw", "Password")], {"pw": ""})["pw"]

    assert len(first) == 24 and first.isalnum()
    assert first != second


def test_required_password_is_generated_when_left_empty():
    result = validate_parameters([param("pw", "Password", required=True)], {"pw": "  "})

    assert len(result["pw"]) == 24


def test_generated_password_respects_length_limits():
    result = validate_parameters([param("pw", "Password", limits={"min": 32})], {})

    assert len(result["pw"]) == 32


def test_given_password_is_checked_like_a_string():
    pw = param("pw", "Password", limits={"min": 12})

    assert errors_for([pw], {"pw": "short"}) == {"pw": "Must be at least 12 characters long."}
    assert validate_parameters([pw], {"pw": "long-enough-pass"}) == {"pw": "long-enough-pass"}


@pytest.mark.parametrize(
    "value", ["first-line\nsecond-line", "windows\r\nline", "tab\there-and-there"]
)
@pytest.mark.parametrize("type_", ["String", "Password"])
def test_a_text_value_is_one_line_without_tabs(type_, value):
    field = param("pw", type_)

    assert errors_for([field], {"pw": value}) == {"pw": "Must be on one line, without tabs."}
    spaced = "words with spaces, and symbols: é ü €"
    assert validate_parameters([field], {"pw": spaced}) == {"pw": spaced}


def test_a_default_and_a_value_held_already_stay_as_they_were_accepted():
    banner = param("banner", default="line one\nline two", modifiable=True)

    assert validate_parameters([banner], {}) == {"banner": "line one\nline two"}
    held = {"banner": "a\tb"}  # accepted before values had to be one line
    assert validate_parameters([banner], {"banner": "a\tb"}, current=held) == held
    assert errors_for([banner], {"banner": "c\td"}, current=held) == {
        "banner": "Must be on one line, without tabs."
    }


def test_a_generated_password_meets_the_parameters_own_rule():
    # "Use a symbol": one generated of letters and digits broke it, and a rotate left empty
    # was then refused for a value the customer never typed.
    pw = param("pw", "Password", regex="^.*[^A-Za-z0-9].*$")

    for _ in range(20):
        assert not validate_parameters([pw], {})["pw"].isalnum()


def test_a_password_rule_a_draw_meets_now_and_then_never_refuses_a_create_left_empty():
    # One draw in 30 meets it: 64 draws refused one create in 6 as "This field is required."
    pw = param("pw", "Password", regex="^[a-z]{4}[A-Za-z0-9._~-]*$")

    for _ in range(100):
        assert validate_parameters([pw], {})["pw"][:4].islower()


def test_generate_password_uses_letters_and_digits():
    assert generate_password(40).isalnum()
    assert len(generate_password(40)) == 40


# --- defaults and required ----------------------------------------------------------------


def test_missing_optional_parameters_take_their_typed_default():
    parameters = [
        param("n", "Float64", default=1),
        param("b", "Boolean", default=False),
        param("db", default="app"),
    ]

    assert validate_parameters(parameters, {"db": ""}) == {"n": 1, "b": False, "db": "app"}


def test_missing_required_parameter():
    assert errors_for([param("db", required=True)], {}) == {"db": "This field is required."}


def test_unknown_key_on_create():
    assert errors_for([param("db", default="app")], {"dbb": "x"}) == {"dbb": "Unknown parameter."}


def test_every_bad_field_is_reported_at_once():
    parameters = [param("n", "Float64", limits={"max": 2}), param("b", "Boolean")]

    assert errors_for(parameters, {"n": "3", "b": "x"}) == {
        "n": "Must be at most 2.",
        "b": "Must be true or false.",
    }


# --- modify -------------------------------------------------------------------------------

PLAN = [
    param("instances", "Float64", modifiable=True, default=1, limits={"min": 1, "max": 5}),
    param("database", modifiable=False, default="app"),
    param("password", "Password", modifiable=False),
]
CURRENT = {"instances": 1, "database": "orders", "password": "s3cret-s3cret"}


def test_modify_keeps_missing_keys_at_their_current_value():
    assert validate_parameters(PLAN, {"instances": "3"}, current=CURRENT) == {
        **CURRENT,
        "instances": 3,
    }


def test_modify_does_not_regenerate_a_password_left_empty():
    result = validate_parameters(PLAN, {"password": ""}, current=CURRENT)

    assert result["password"] == "s3cret-s3cret"


def test_modify_refuses_to_change_a_non_modifiable_parameter():
    assert errors_for(PLAN, {"database": "other"}, current=CURRENT) == {
        "database": "Cannot be changed after creation."
    }


def test_modify_accepts_a_non_modifiable_parameter_given_unchanged():
    assert validate_parameters(PLAN, {"database": "orders"}, current=CURRENT) == CURRENT


def test_modify_still_checks_limits():
    assert errors_for(PLAN, {"instances": "6"}, current=CURRENT) == {
        "instances": "Must be between 1 and 5."
    }


def test_modify_refuses_unknown_keys():
    assert errors_for(PLAN, {"replicas": "2"}, current=CURRENT) == {
        "replicas": "Unknown parameter."
    }


def test_modify_gives_a_parameter_added_since_creation_its_default():
    plan = [*PLAN, param("ssl", "Boolean", modifiable=True, default=True)]

    assert validate_parameters(plan, {}, current=CURRENT) == {**CURRENT, "ssl": True}


def test_parameter_errors_message_names_each_key():
    with pytest.raises(ParameterErrors) as caught:
        validate_parameters(PLAN, {"database": "x"}, current=CURRENT)

    assert str(caught.value) == "database: Cannot be changed after creation."


def test_a_grow_only_parameter_may_rise_or_stay_but_not_fall_in_a_modify():
    plan = [param("storageGi", "Float64", modifiable=True, default=10.0, grow_only=True)]
    now = {"storageGi": 10}

    assert validate_parameters(plan, {"storageGi": "12"}, current=now) == {"storageGi": 12}
    assert validate_parameters(plan, {"storageGi": "10"}, current=now) == {"storageGi": 10}
    assert errors_for(plan, {"storageGi": "8"}, current=now) == {
        "storageGi": "Can grow, not shrink: it is 10 now."
    }
    assert validate_parameters(plan, {"storageGi": "1"})["storageGi"] == 1  # a create: any size
