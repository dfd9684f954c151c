"""Spec YAML is parsed within bounds: alias expansion, recursive aliases and nesting depth."""

import tracemalloc
from pathlib import Path

import pytest
import yaml

from deployments.spec import SpecError, load_spec, validate
from deployments.workflow import safe_yaml
from deployments.workflow.render import Context, RenderError, render_manifest

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = (ROOT / "docs" / "examples" / "postgres-minimal.yaml").read_text()
CNPG = ROOT / "specs" / "postgres-cnpg.yaml"
REAL_SPECS = [
    CNPG,
    ROOT / "docs" / "examples" / "postgres-minimal.yaml",
    *sorted((ROOT / "tests" / "engine" / "specs").glob("*.yaml")),
]


def with_extension(block: str) -> str:
    """The guide's valid example spec with `block` added under `x-opsdeck` (from line 11)."""
    assert MINIMAL.splitlines()[9] == "x-opsdeck:"
    return MINIMAL.replace("x-opsdeck:\n", "x-opsdeck:\n" + block, 1)


def laughs(levels: int) -> str:
    """The "billion laughs": each level is ten aliases of the one before, 10**levels values."""
    lines = ["  lol0: &lol0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    for i in range(1, levels):
        lines.append(f"  lol{i}: &lol{i} [" + ", ".join([f"*lol{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def spec_error(text: str) -> list[str]:
    with pytest.raises(SpecError) as error:
        load_spec(text)
    return error.value.errors


# --- the loader refuses what would blow up later -----------------------------------------------


def test_a_billion_laughs_under_x_opsdeck_is_refused_before_it_costs_memory():
    text = with_extension(laughs(9))

    tracemalloc.start()
    try:
        errors = spec_error(text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()

    assert errors == [
        "The spec is not valid YAML at line 16, column 16: "
        "alias *lol4 expands the document to more than 200000 values"
    ]
    assert peak < 5_000_000


def test_a_recursive_alias_is_refused():
    errors = spec_error(with_extension("  loop: &r [*r]\n"))

    assert errors == [
        "The spec is not valid YAML at line 11, column 13: "
        "alias *r is inside its own anchor &r (recursive aliases are not allowed)"
    ]


def test_an_alias_deeper_inside_its_own_anchor_is_refused():
    errors = spec_error(with_extension("  loop: &r {a: [b, {c: *r}]}\n"))

    assert errors == [
        "The spec is not valid YAML at line 11, column 24: "
        "alias *r is inside its own anchor &r (recursive aliases are not allowed)"
    ]


@pytest.mark.parametrize(
    "deep",
    ["[" * 10_000 + "]" * 10_000, "{a: " * 10_000 + "1" + "}" * 10_000],
    ids=["lists", "mappings"],
)
def test_ten_thousand_levels_of_nesting_are_refused_without_a_recursion_error(deep):
    errors = spec_error(with_extension(f"  deep: {deep}\n"))

    assert len(errors) == 1
    assert errors[0].startswith("The spec is not valid YAML at line 11, column ")
    assert errors[0].endswith(": the document nests deeper than 64 levels")


def test_aliases_that_nest_one_another_count_as_the_depth_they_stand_for():
    chain = "  d0: &d0 [x]\n" + "".join(f"  d{i}: &d{i} [*d{i - 1}]\n" for i in range(1, 70))

    errors = spec_error(with_extension(chain))

    assert errors == [
        "The spec is not valid YAML at line 73, column 14: "
        "alias *d61 makes the document nest deeper than 64 levels"
    ]


def test_a_large_scalar_repeated_by_aliases_is_refused_for_its_text():
    big = "x" * 1_000_000
    block = f"  big: &big {big}\n  copies: [" + ", ".join(["*big"] * 30) + "]\n"

    errors = spec_error(with_extension(block))

    assert len(errors) == 1
    assert errors[0].startswith("The spec is not valid YAML at line 12, column ")
    assert errors[0].endswith(": alias *big expands the document to more than 20 MB of text")


def test_a_text_longer_than_any_document_it_may_hold_is_refused_before_it_is_parsed():
    """Parsing 30 MB of YAML takes the pure-Python parser most of a minute; the length alone
    says the document is beyond the bound."""
    block = "  big: " + "x" * 30_000_000 + "\n"

    errors = spec_error(with_extension(block))

    assert len(errors) == 1
    assert errors[0].startswith("The spec is not valid YAML at line 11, column ")
    assert errors[0].endswith(": the text is longer than 20 MB")


# --- what real specs do still works ------------------------------------------------------------


@pytest.mark.parametrize("path", REAL_SPECS, ids=lambda p: p.name)
def test_the_real_specs_still_load(path):
    spec = load_spec(path.read_text())

    assert spec.services


def test_the_cnpg_spec_reuses_its_manifests_through_anchors_and_aliases():
    spec = load_spec(CNPG.read_text())

    verbs = spec.main.verbs
    credentials = verbs["create"].workflow.templates["credentials"].resource.manifest
    for verb in ("modify", "restore"):
        assert verbs[verb].workflow.templates["credentials"].resource.manifest == credentials
    assert "kind: Secret" in credentials


def test_an_alias_used_many_times_within_the_bounds_is_fine():
    copies = ", ".join(["*shared"] * 1000)
    block = f"  shared: &shared {{cpu: 1, memory: 2Gi}}\n  copies: [{copies}]\n"

    spec = load_spec(with_extension(block))

    assert spec.extensions["copies"][999] == {"cpu": 1, "memory": "2Gi"}


def test_the_operators_crds_are_within_the_depth_bound():
    for path in sorted((ROOT / "sandbox" / "crds").glob("*.yaml")):
        assert safe_yaml.load_all(path.read_text())


# --- manifests, parsed again inside the spec ----------------------------------------------------

MANIFEST_SPEC = """\
name: Manifest
services:
  - name: db
    operatorCRDConfiguration: {}
    systemWorkflows:
      create: &verb
        workflow:
          entrypoint: main
          activeDeadlineSeconds: 600
          templates:
            - name: main
              resource:
                action: apply
                manifest: |
                  apiVersion: v1
                  kind: ConfigMap
                  metadata: &meta
                    name: {{ $sys.id }}
                    labels: {copy: *meta}
      modify: *verb
      delete: *verb
"""


def test_a_recursive_alias_inside_a_manifest_is_a_validation_error_at_the_manifest():
    result = validate(MANIFEST_SPEC)

    assert result.errors == [
        f"services[0].systemWorkflows.{verb}.workflow.templates[0].resource.manifest: "
        "the manifest is not valid YAML at line 5, column 18: "
        "alias *meta is inside its own anchor &meta (recursive aliases are not allowed)"
        for verb in ("create", "modify", "delete")
    ]


def test_rendering_a_deeply_nested_manifest_is_a_render_error():
    manifest = "apiVersion: v1\nkind: ConfigMap\ndata: " + "[" * 5000 + "]" * 5000 + "\n"

    with pytest.raises(RenderError) as error:
        render_manifest(manifest, Context(var={}, sys={}), where="templates[0].resource.manifest")

    assert str(error.value) == (
        "invalid YAML: the document nests deeper than 64 levels (line 3) "
        "in templates[0].resource.manifest"
    )


def test_rendering_a_billion_laughs_manifest_is_a_render_error():
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\ndata:\n" + laughs(6)

    with pytest.raises(RenderError, match="alias \\*lol4 expands the document to more than"):
        render_manifest(manifest, Context(var={}, sys={}))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("name: a: b\n", "mapping values are not allowed here"),
        ("a: 1\n\tb: 2\n", "found character '\\t' that cannot start any token"),
        ("a: [1, 2\n", "expected ',' or ']', but got '<stream end>'"),
        ("a: 1\na: 2\n", 'the key "a" is written twice in one mapping'),
    ],
)
def test_text_refused_is_said_in_pyyamls_words_quoting_its_line(text, words):
    """Read with libyaml first, whose words differ ("not allowed in this context") and whose
    error quotes no line: a refusal is said as PyYAML's own parser says it."""
    with pytest.raises(yaml.MarkedYAMLError) as refused:
        safe_yaml.load(text)

    said = str(refused.value)
    assert words in said
    assert "^" in said  # the line, quoted, with the place marked


def test_plain_and_quoted_placeholders_keep_their_types_as_libyaml_reads_them():
    """libyaml marks a plain scalar's style "" where PyYAML's parser says None: a whole
    placeholder written plain still takes its value's type, a quoted one stays text."""
    ctx = Context(var={"n": 3}, sys={})
    rendered = render_manifest("plain: {{ $var.n }}\nquoted: '{{ $var.n }}'\n", ctx)

    assert rendered == {"plain": 3, "quoted": "3"}
