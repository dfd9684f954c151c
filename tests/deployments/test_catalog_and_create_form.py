"""The catalog ("New deployment"), the generated create form and its live cost estimate."""

import re
from decimal import Decimal
from html import unescape

import pytest
from django.core.exceptions import ValidationError
from django.urls import NoReverseMatch, reverse

from accounts import services as account_services
from accounts.audit import Actor
from accounts.models import AuditEvent
from deployments import services
from deployments.forms import parameter_form_class
from deployments.models import Cell, Instance, Operation
from deployments.spec.model import Parameter
from tests.deployments.conftest import SPEC


@pytest.fixture
def plan(db):
    return services.plan_load(text=SPEC.read_text()).plan


@pytest.fixture
def cell(db):
    return Cell.objects.create(name="eu-1", region="eu", is_default=True)


def catalog_url(tenant):
    return f"/t/{tenant.slug}/deployments/new/"


def form_url(tenant, request_id="0" * 32):
    return f"/t/{tenant.slug}/deployments/new/postgres-cnpg/?request={request_id}"


def estimate_url(tenant):
    return f"/t/{tenant.slug}/deployments/new/postgres-cnpg/estimate/"


def instance_page(tenant, instance) -> str:
    """Where a created instance is shown: its own page once there is one, else the list."""
    try:
        return reverse("instance_detail", args=[tenant.slug, instance.pk])
    except NoReverseMatch:
        return reverse("instance_list", args=[tenant.slug])


def text(response) -> str:
    return unescape(re.sub(r"\s+", " ", response.content.decode()))


VALID = {"name": "orders", "p-instances": "3", "p-cpu": "2", "p-version": "17"}


# --- catalog ------------------------------------------------------------------------------


def test_the_catalog_lists_each_plan_under_its_service_with_prices_for_its_defaults(
    owner_client, tenant, plan
):
    response = owner_client.get(catalog_url(tenant))

    page = text(response)
    assert response.status_code == 200
    assert "<h1>New deployment</h1>" in page
    assert '<h2 id="service-postgresql">PostgreSQL</h2>' in page  # x-opsdeck.serviceName
    assert "<h3>PostgreSQL</h3>" not in page  # its only plan, named as the service
    # 1 core x 0.035 + 2 GiB x 0.005 + 10 GiB x 0.00014 = 0.0464 an hour, 33.87 a month
    assert "<strong>0.0464 USD</strong> per hour" in page
    assert "<strong>33.87 USD</strong> per month" in page
    assert "<dt>Servers</dt><dd>1 to 5</dd>" in page
    assert "Storage: 0.00014 USD per GiB per hour" in page
    assert f'href="/t/{tenant.slug}/deployments/new/postgres-cnpg/"' in page


def test_after_a_price_change_the_catalog_prices_at_this_months_and_says_what_comes(
    owner_client, tenant, plan
):
    from billing import periods, usage
    from billing.usage import UsageRow

    usage.record(periods.current_start(), [
        UsageRow(tenant_id=tenant.pk, plan_id=plan.pk, instance_id="inst-abcdefgh",
                 instance_name="orders", dimension="cpu", unit="core", quantity=Decimal(1))
    ])  # fmt: skip
    services.plan_load(text=SPEC.read_text().replace('price: "0.035"', 'price: "0.07"'))
    starts = periods.next_start()

    page = text(owner_client.get(catalog_url(tenant)))

    assert "<strong>0.0464 USD</strong> per hour" in page  # at the price in effect
    assert (
        f'CPU: 0.035 USD per core per hour<span class="price-change">; from <time datetime="'
        f'{starts.isoformat()}">{starts.day} {starts:%b %Y}</time>: 0.07 USD per core per hour'
    ) in page


def test_a_viewer_sees_the_catalog_without_create_links_and_cannot_open_the_form(
    client, tenant, plan, add_member
):
    client.force_login(add_member("viewer@example.com", "viewer"))

    catalog = client.get(catalog_url(tenant))
    form = client.get(form_url(tenant))

    assert catalog.status_code == 200
    assert "0.0464 USD" in text(catalog)
    assert "Create instance" not in text(catalog)
    assert form.status_code == 403


# --- the form builder ----------------------------------------------------------------------

PARAMETERS = [
    Parameter(
        "tier", "Tier", "Service tier.", "String", options=["small", "large"], default="small"
    ),
    Parameter("db", "Database", "Its name.", "String", regex="^[a-z]+$", required=True),
    Parameter(
        "size", "Size", "GiB.", "Float64", limits={"min": 10, "max": 100}, step=10, default=20
    ),
    Parameter("tls", "TLS", "Encrypt.", "Boolean", default=True, modifiable=True),
    Parameter("secret", "Secret", "A secret.", "Password", limits={"min": 12}, modifiable=True),
    Parameter("extra", "Extra", "Settings.", "JSON", default={"a": 1}),
]
VALID_INPUT = {"p-tier": "large", "p-db": "app", "p-size": "30", "p-tls": "on", "p-extra": "[1]"}


def builder(**options):
    return parameter_form_class(
        PARAMETERS, groups=[{"name": "Basics", "parameters": ["db", "tier"]}], **options
    )


def test_each_parameter_type_gets_its_own_input_with_the_specs_label_help_and_default():
    html = builder()().as_div()

    assert re.search(r'<select name="p-tier"[^>]*>\s*<option value="small" selected>', html)
    assert re.search(r'<input type="text" name="p-db"[^>]*required', html)
    assert re.search(
        r'<input type="number" name="p-size" value="20" step="10" min="10" max="100"', html
    )
    assert re.search(r'<input type="checkbox" name="p-tls"[^>]*checked', html)
    assert re.search(
        r'<input type="password" name="p-secret"[^>]*autocomplete="new-password"', html
    )
    assert re.search(r"<textarea name=\"p-extra\"[^>]*>\s*{&quot;a&quot;: 1}</textarea>", html)
    assert "Service tier." in html and "Leave empty to have one generated." in html


def test_valid_values_of_every_type_become_typed_values():
    form = builder()(VALID_INPUT)

    assert form.is_valid(), form.errors
    values = form.values
    assert {k: values[k] for k in ("tier", "db", "size", "tls", "extra")} == {
        "tier": "large",
        "db": "app",
        "size": 30,
        "tls": True,
        "extra": [1],
    }
    assert len(values["secret"]) >= 12  # left empty: generated
    assert "secret" not in form.given  # and not sent to the service, which generates it


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("p-tier", "huge", "Must be one of: small, large."),
        ("p-db", "App-1", "Must match the pattern ^[a-z]+$."),
        ("p-db", "", "This field is required."),
        ("p-size", "120", "Must be between 10 and 100."),
        ("p-size", "25", "Must go in steps of 10 from 10."),
        ("p-size", "ten", "Must be a number."),
        ("p-secret", "short", "Must be at least 12 characters long."),
        (
            "p-extra",
            "{nope",
            "Must be valid JSON (Expecting property name enclosed in double quotes",
        ),
    ],
)
def test_invalid_values_get_the_services_own_message_on_their_field(field, value, message):
    form = builder()({**VALID_INPUT, field: value})

    assert not form.is_valid()
    assert form.errors[field][0].startswith(message)


def test_an_unchecked_checkbox_is_false_even_when_the_default_is_true():
    form = builder()({k: v for k, v in VALID_INPUT.items() if k != "p-tls"})

    assert form.is_valid()
    assert form.values["tls"] is False


def test_fields_come_under_the_specs_headings_and_the_rest_under_other_settings():
    groups = builder()().field_groups()

    assert [(g.name, [f.name for f in g.fields]) for g in groups] == [
        ("Basics", ["p-db", "p-tier"]),
        ("Other settings", ["p-size", "p-tls", "p-secret", "p-extra"]),
    ]


def test_a_modify_form_shows_the_modifiable_parameters_with_current_values_never_a_password():
    current = {"tier": "small", "db": "app", "size": 20, "tls": False, "secret": "s3cret-s3cret"}
    form_class = builder(current=current)

    assert list(form_class.base_fields) == ["p-tls", "p-secret"]
    html = form_class().as_div()
    assert "s3cret" not in html
    assert not re.search(r'name="p-tls"[^>]*checked', html)
    form = form_class({"p-tls": "on"})
    assert form.is_valid(), form.errors
    assert form.values == {**current, "tls": True, "extra": {"a": 1}}  # a default fills a gap


# --- the create form ------------------------------------------------------------------------


def test_the_form_gets_a_request_id_in_its_address_and_shows_the_estimate_for_the_defaults(
    owner_client, tenant, plan, cell
):
    first = owner_client.get(f"/t/{tenant.slug}/deployments/new/postgres-cnpg/")
    assert first.status_code == 302
    assert re.search(r"\?request=[0-9a-f]{32}$", first.url)

    page = text(owner_client.get(first.url))
    assert "<h1>Create instance</h1>" in page
    assert "<legend><h2>Size</h2></legend>" in page
    assert 'id="estimate-hour">0.0464<' in page
    assert 'id="estimate-month">33.87<' in page
    assert 'name="cell"' not in page  # one cell offered: nothing to choose


@pytest.mark.parametrize("body", [{}, {"content_type": "application/json", "data": "{}"}])
def test_a_create_posted_without_any_field_shows_the_form_with_what_to_give(
    owner_client, tenant, plan, cell, body
):
    """A forged post carrying no form field (an empty or a JSON body) was a 500."""
    response = owner_client.post(form_url(tenant), **body)

    assert response.status_code == 200
    assert "Give the instance a name." in text(response)
    assert not Instance.objects.exists()


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("p-owner", "postgres", "“postgres”"),
        ("p-owner", "pg_app", "names starting with “pg_”"),
        ("p-database", "template1", "“template1”"),
    ],
)
def test_a_name_postgresql_keeps_for_itself_is_refused_beside_its_field(
    owner_client, tenant, plan, cell, field, value, why
):
    """The owner's password would be the superuser's, or the bootstrap would fail."""
    response = owner_client.post(form_url(tenant), {**VALID, field: value, "request_id": "r-1"})

    assert response.status_code == 200
    assert f"The service keeps {why} for itself: choose another." in text(response)
    assert not Instance.objects.exists()


def test_a_password_field_has_a_generate_button_and_says_empty_is_generated(
    owner_client, tenant, plan, cell
):
    url = f"/t/{tenant.slug}/deployments/new/postgres-cnpg/?request={'d' * 32}"

    page = text(owner_client.get(url))

    assert re.search(
        r'<div role="group" class="password-group"><input type="password" name="p-password"'
        r'[^>]*id="id_p-password"[^>]*><button type="button" class="secondary outline" '
        r'data-generate="id_p-password" aria-controls="id_p-password">Generate</button></div>',
        page,
    )
    assert "Leave empty to have one generated." in page
    assert re.search(r'<script src="[^"]*js/opsdeck[.0-9a-f]*\.js" defer></script>', page)
    assert "<script>" not in page  # no inline script


def test_a_region_is_chosen_among_the_cells_offered_to_the_tenant_only(
    owner_client, tenant, plan, cell
):
    Cell.objects.create(name="us-1", region="us")
    Cell.objects.create(name="private", region="secret-region", public=False)

    page = text(owner_client.get(form_url(tenant)))

    assert f'<option value="{cell.pk}" selected>eu (eu-1)</option>' in page
    assert "us (us-1)" in page
    assert "secret-region" not in page


@pytest.mark.parametrize("regions", [["us-1"], ["us-1", "ap-1"]])
def test_the_form_offers_only_the_regions_the_plan_runs_in_and_a_create_goes_to_one(
    owner_client, tenant, cell, regions
):
    """A plan that runs in us-1 only, for an organization offered eu-1 (the default) and us-1:
    the form offered and pre-selected eu-1, and sent as drawn was refused with "The PostgreSQL
    plan does not run in the eu-1 cell; choose one of: us-1."."""
    text_ = SPEC.read_text().replace(
        "  entitlements:\n", f"  entitlements:\n    cells: [{', '.join(regions)}]\n", 1
    )
    services.plan_load(text=text_)
    us = Cell.objects.create(name="us-1", region="us")
    ap = Cell.objects.create(name="ap-1", region="ap")

    page = text(owner_client.get(form_url(tenant)))
    assert "eu (eu-1)" not in page
    assert ("ap (ap-1)" in page) == ("ap-1" in regions)
    sent = dict(re.findall(r'name="([^"]+)"[^>]*value="([^"]*)"', page.split("<form", 2)[-1]))
    chosen = re.search(r'<select name="cell"[^>]*> <option value="(\d+)" selected>', page)
    if chosen:
        sent["cell"] = chosen.group(1)
    owner_client.post(form_url(tenant), {**sent, **VALID})

    assert Instance.objects.get(name="orders").cell in (us, ap)


def test_a_region_withdrawn_while_the_form_was_open_is_refused_never_replaced(
    owner_client, tenant, plan, cell
):
    chosen = Cell.objects.create(name="us-1", region="us")
    assert "us (us-1)" in text(owner_client.get(form_url(tenant)))  # the form offers both
    Cell.objects.filter(pk=chosen.pk).update(public=False)  # withdrawn meanwhile

    response = owner_client.post(form_url(tenant), {**VALID, "cell": str(chosen.pk)})

    assert response.status_code == 200
    assert (
        'id="id_cell_error">This region is no longer offered to your organization: '
        "choose another." in text(response)
    )
    assert not Instance.objects.exists()  # not made in the region left


def test_a_post_with_errors_creates_nothing_and_shows_them_beside_the_fields_and_at_the_top(
    owner_client, tenant, plan, cell
):
    response = owner_client.post(
        form_url(tenant),
        {**VALID, "p-database": "Orders", "p-instances": "9", "p-password": "too-short"},
    )

    page = text(response)
    assert response.status_code == 200
    assert not Instance.objects.exists()
    letters = "Use lowercase letters, digits and underscores, starting with a letter."
    assert f'<a href="#id_p-database">Database: {letters}</a>' in page
    assert (
        '<small class="field-error" id="id_p-instances_error">Must be between 1 and 5.</small>'
        in page
    )
    assert 'id="id_p-password_error">Must be between 12 and 100 characters long.' in page
    assert 'name="p-database" value="Orders"' in page  # what was typed is kept
    assert 'name="name" value="orders"' in page
    assert "too-short" not in page  # but never a password
    assert "Enter valid values to see the price." in page


def test_a_valid_post_creates_one_instance_and_says_so(owner_client, tenant, plan, cell):
    response = owner_client.post(form_url(tenant), VALID, follow=True)

    instance = Instance.objects.get()
    assert (instance.name, instance.tenant, instance.cell) == ("orders", tenant, cell)
    assert instance.parameters["instances"] == 3 and instance.parameters["cpu"] == 2
    assert Operation.objects.get().verb == "create"
    assert response.redirect_chain[0][0] == instance_page(tenant, instance)
    assert "Creating orders." in text(response)


def test_a_repeated_post_with_the_same_request_id_creates_one_instance(
    owner_client, tenant, plan, cell
):
    url = form_url(tenant, "a" * 32)
    owner_client.post(url, {**VALID, "request_id": "a" * 32})
    again = owner_client.post(url, {**VALID, "request_id": "a" * 32})

    assert again.status_code == 302
    assert Instance.objects.count() == 1
    assert Operation.objects.count() == 1


def test_the_form_again_after_back_says_what_it_made_and_links_a_new_form(
    owner_client, tenant, plan, cell
):
    url = form_url(tenant, "a" * 32)
    owner_client.post(url, {**VALID, "request_id": "a" * 32})
    made = Instance.objects.get()

    back = text(owner_client.get(url))  # Back fetches the form again, with the same id

    assert f'made <a href="/t/{tenant.slug}/deployments/{made.pk}/">{made.name}</a>' in back
    new_form = f'<a href="/t/{tenant.slug}/deployments/new/postgres-cnpg/">Start a new form</a>'
    assert new_form in back
    assert 'name="request_id"' not in back  # no form to send a second instance with
    assert 'id="form-made"' not in text(owner_client.get(form_url(tenant, "b" * 32)))


def test_a_form_sent_again_from_a_stale_tab_is_refused_and_corrected_makes_another(
    owner_client, tenant, plan, cell
):
    url = form_url(tenant, "a" * 32)
    owner_client.post(url, {**VALID, "request_id": "a" * 32})
    made = Instance.objects.get()

    changed = text(owner_client.post(url, {**VALID, "name": "other", "request_id": "a" * 32}))
    invalid = text(owner_client.post(url, {**VALID, "p-database": "1x", "request_id": "a" * 32}))

    assert "This form was already sent with different values." in changed
    for page in (changed, invalid):
        assert f'made <a href="/t/{tenant.slug}/deployments/{made.pk}/">{made.name}</a>' in page
        assert "Sent now, it makes another instance." in page
        # ... as it does: it goes out next as a new request.
        fresh = re.search(r'name="request_id" value="([0-9a-f]{32})"', page)[1]
        assert fresh != "a" * 32
    owner_client.post(form_url(tenant, fresh), {**VALID, "name": "other", "request_id": fresh})
    assert sorted(Instance.objects.values_list("name", flat=True)) == [made.name, "other"]


@pytest.mark.parametrize("request_id", ["\x00nul", "z" * 300])
def test_a_forged_request_id_is_a_message_on_the_form_not_a_server_error(
    owner_client, tenant, plan, cell, request_id
):
    response = owner_client.post(form_url(tenant), {**VALID, "request_id": request_id})

    assert response.status_code == 200
    assert "Request id: " in text(response)  # beside the form, as any field's error
    assert not Instance.objects.exists()


def test_a_name_another_instance_has_is_refused_beside_the_name_field(
    owner_client, tenant, plan, cell
):
    owner_client.post(form_url(tenant, "a" * 32), {**VALID, "request_id": "a" * 32})

    response = owner_client.post(
        form_url(tenant, "b" * 32), {**VALID, "name": "ORDERS ", "request_id": "b" * 32}
    )

    assert response.status_code == 200
    assert (
        'id="id_name_error">Another instance of your organization is called “orders”: '
        "choose another name." in text(response)
    )
    assert Instance.objects.count() == 1 and Operation.objects.count() == 1


LIKE_ID = (
    "Names of the form inst- and 8 letters or digits are kept for instance ids: choose another "
    "name."
)


@pytest.mark.parametrize("name", ["\u3164", "\u2800\u2800", "\uffa0"])
def test_a_name_of_blank_letters_only_is_refused_beside_the_name_field(
    owner_client, tenant, plan, cell, name
):
    """Letters that print as nothing (Hangul filler, a blank Braille cell) made an instance
    whose name the list, its heading and the delete dialog showed as nothing."""
    response = owner_client.post(form_url(tenant), {**VALID, "name": name, "request_id": "r-1"})

    said = "Give the instance a name people can see."
    assert f'<small class="field-error" id="id_name_error">{said}</small>' in text(response)
    assert not Instance.objects.exists()


@pytest.mark.parametrize("name", ["inst-abcd1234", "INST-ABCD1234", " inst\u2010abcd1234 "])
def test_a_name_shaped_like_an_instance_id_is_refused_beside_the_name_field(
    owner_client, tenant, plan, cell, name
):
    response = owner_client.post(form_url(tenant), {**VALID, "name": name, "request_id": "r-1"})

    page = text(response)
    assert f'<small class="field-error" id="id_name_error">{LIKE_ID}</small>' in page
    assert f'<a href="#id_name">Instance name: {LIKE_ID}</a>' in page  # and in the summary
    assert not Instance.objects.exists()


def test_a_name_shaped_like_an_id_is_flagged_with_the_values_the_form_refuses(
    owner_client, tenant, plan, cell
):
    response = owner_client.post(
        form_url(tenant), {**VALID, "name": "inst-abcd1234", "p-instances": "99"}
    )

    page = text(response)
    assert f'id="id_name_error">{LIKE_ID}' in page
    assert 'id="id_p-instances_error">' in page
    assert not Instance.objects.exists()


def test_the_service_refuses_a_name_shaped_like_an_id_and_takes_names_that_only_start_so(
    tenant, owner, plan, cell
):
    def create(name):
        return services.instance_create(
            actor=Actor(user=owner), tenant=tenant, plan=plan, name=name,
            parameters={}, request_id=name,
        )  # fmt: skip

    with pytest.raises(ValidationError) as refused:
        create("inst-0a1b2c3d")
    made = [create(name).instance.name for name in ("inst-0a1b2c3d-copy", "inst-abc", "inst 12")]

    assert refused.value.message_dict == {"name": [LIKE_ID]}
    assert made == ["inst-0a1b2c3d-copy", "inst-abc", "inst 12"]


def test_a_name_taken_is_flagged_in_the_same_answer_as_the_values_the_form_refuses(
    owner_client, tenant, plan, cell
):
    owner_client.post(form_url(tenant, "a" * 32), {**VALID, "request_id": "a" * 32})

    response = owner_client.post(
        form_url(tenant, "b" * 32),
        {**VALID, "name": "Orders", "p-instances": "99", "request_id": "b" * 32},
    )

    page = text(response)
    assert 'id="id_name_error">Another instance of your organization is called “orders”' in page
    assert 'id="id_p-instances_error">' in page  # and the value refused, beside it
    assert Instance.objects.count() == 1


def test_a_service_refusal_is_shown_and_creates_nothing(owner_client, tenant, plan, cell):
    plan.limits = {"max_instances": 0}
    plan.save()

    response = owner_client.post(form_url(tenant), VALID, follow=True)

    assert "allows at most 0 instances per organization" in text(response)
    assert not Instance.objects.exists()


def test_a_viewer_posting_the_form_is_refused_and_the_refusal_audited(
    client, tenant, plan, cell, add_member
):
    client.force_login(add_member("viewer@example.com", "viewer"))

    response = client.post(form_url(tenant), VALID)

    assert response.status_code == 403
    assert not Instance.objects.exists()
    denied = AuditEvent.objects.get(action="instance.create", result=AuditEvent.Result.DENIED)
    assert denied.actor_email == "viewer@example.com"


def test_another_tenants_catalog_form_and_estimate_are_404(client, owner, plan, cell, make_user):
    outsider = make_user("outsider@example.com")
    other = account_services.tenant_create(actor=Actor(user=owner), name="Other")
    client.force_login(outsider)

    assert client.get(catalog_url(other)).status_code == 404
    assert client.get(form_url(other)).status_code == 404
    assert client.post(form_url(other), VALID).status_code == 404
    assert client.post(estimate_url(other), VALID).status_code == 404
    assert not Instance.objects.exists()


def test_an_unknown_plan_is_404(owner_client, tenant, plan):
    assert (
        owner_client.get(f"/t/{tenant.slug}/deployments/new/nope/?request={'0' * 32}").status_code
        == 404
    )


# --- the estimate ---------------------------------------------------------------------------


def test_the_estimate_prices_the_values_entered_per_dimension_and_in_total(
    owner_client, tenant, plan
):
    response = owner_client.post(
        estimate_url(tenant),
        {"p-instances": "3", "p-cpu": "2", "p-memoryGi": "4", "p-storageGi": "100"},
    )

    page = text(response)
    assert response.status_code == 200
    assert "<html" not in page  # only the partial
    # cpu 6 x 0.035 = 0.21; memory 12 x 0.005 = 0.06; storage 300 x 0.00014 = 0.042
    assert (
        '<td>CPU <small class="muted">6 cores</small></td>'
        '<td class="num">0.2100</td><td class="num">153.30</td>' in page
    )
    assert '<td>Memory <small class="muted">12 GiB</small></td>' in page
    assert 'id="estimate-hour">0.3120<' in page
    assert 'id="estimate-month">227.76<' in page


def test_the_estimate_of_invalid_values_asks_for_valid_ones(owner_client, tenant, plan):
    response = owner_client.post(estimate_url(tenant), {"p-instances": "many"})

    assert response.status_code == 200
    assert "Enter valid values to see the price." in text(response)


def test_plans_are_grouped_by_service_and_each_shows_its_latest_version(owner_client, tenant, plan):
    mysql = (
        SPEC.read_text()
        .replace("name: PostgreSQL\n", "name: MySQL-ish\n", 1)
        .replace("plan: postgres-cnpg", "plan: mysqlish")
        .replace("service: postgresql", "service: mysql")
        .replace("serviceName: PostgreSQL", "serviceName: MySQL")
    )
    services.plan_load(text=mysql)
    services.plan_load(
        text=SPEC.read_text().replace("name: PostgreSQL\n", "name: PostgreSQL\n# v2\n", 1)
    )

    page = text(owner_client.get(catalog_url(tenant)))

    assert (
        page.index('<h2 id="service-mysql">MySQL</h2>')
        < page.index("MySQL-ish")
        < page.index('id="service-postgresql"')
    )
    postgres = page[page.index('id="plan-postgres-cnpg"') :]
    assert "Version 2" in postgres
    assert "<h3>MySQL-ish</h3>" in page  # a plan named otherwise than its service


def test_a_service_with_two_plans_names_each_plan(owner_client, tenant, plan):
    services.plan_load(
        text=SPEC.read_text()
        .replace("name: PostgreSQL\n", "name: PostgreSQL HA\n", 1)
        .replace("plan: postgres-cnpg", "plan: postgres-ha")
    )

    page = text(owner_client.get(catalog_url(tenant)))

    assert page.count('<h2 id="service-postgresql">PostgreSQL</h2>') == 1
    assert "<h3>PostgreSQL</h3>" in page and "<h3>PostgreSQL HA</h3>" in page


# --- the tenant's own prices ----------------------------------------------------------------


def _override(tenant, plan, prices, *, starts):
    from billing.models import PlanOverride

    return PlanOverride.objects.create(
        tenant=tenant, plan=plan, prices=prices, effective_from=starts
    )


def test_the_catalog_and_the_estimate_price_at_the_tenants_override_not_the_list_price(
    owner_client, tenant, plan, make_user
):
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    _override(tenant, plan, {"cpu": "0.05"}, starts=now - timedelta(days=1))
    _override(tenant, plan, {"cpu": "0.5"}, starts=now + timedelta(days=1))  # not yet
    other = account_services.tenant_create(actor=Actor(user=make_user("o@example.com")), name="O")
    _override(other, plan, {"cpu": "0.001"}, starts=now - timedelta(days=1))  # not theirs

    catalog = text(owner_client.get(catalog_url(tenant)))
    estimate = text(owner_client.post(estimate_url(tenant), {"p-instances": "3", "p-cpu": "2"}))

    # 1 core x 0.05 + 2 GiB x 0.005 + 10 GiB x 0.00014 = 0.0614 an hour (0.0464 at list prices)
    assert "<strong>0.0614 USD</strong> per hour" in catalog
    assert "CPU: 0.05 USD per core per hour" in catalog
    assert "Storage: 0.00014 USD per GiB per hour" in catalog  # not overridden
    # 6 cores x 0.05 = 0.30
    assert '<td>CPU <small class="muted">6 cores</small></td><td class="num">0.3000</td>' in (
        estimate
    )


def test_while_stripe_bills_the_catalog_and_the_estimate_price_at_what_stripe_charges(
    owner_client, tenant, plan, settings
):
    from datetime import timedelta

    from django.utils import timezone

    # An override's prices, set while billing was local: Stripe's catalog holds none of them.
    _override(tenant, plan, {"cpu": "0.05"}, starts=timezone.now() - timedelta(days=1))
    settings.STRIPE_API_KEY = "sk_test_opsdeck_catalog"

    catalog = text(owner_client.get(catalog_url(tenant)))
    estimate = text(owner_client.post(estimate_url(tenant), {"p-instances": "3", "p-cpu": "2"}))

    assert "<strong>0.0464 USD</strong> per hour" in catalog
    assert "CPU: 0.035 USD per core per hour" in catalog
    # 6 cores x 0.035 = 0.21
    assert '<td>CPU <small class="muted">6 cores</small></td><td class="num">0.2100</td>' in (
        estimate
    )
