# ruff: noqa: F811 (the fixtures imported from the instance page tests are parameters here)
"""The instance page's Modify dialog: the modifiable parameters prefilled, the cost of the
change, and a modify queued with only what changed."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from accounts.models import AuditEvent
from deployments.models import Instance, Operation
from tests.deployments.test_instance_page import (  # noqa: F401 (fixtures)
    SECRET,
    _url,
    instance,
    local_cell,
    plan,
)


def _modify(client, instance, **values):
    data = {"request_id": "mod-1", **{f"p-{key}": value for key, value in values.items()}}
    return client.post(_url(instance, "modify/"), data)


def test_the_dialog_lists_only_modifiable_parameters_with_current_values_and_no_password(
    owner_client, instance
):
    html = owner_client.get(_url(instance)).content.decode()

    assert 'id="dialog-modify"' in html
    assert 'name="p-instances"' in html and 'value="2"' in html
    assert 'name="p-cpu"' in html and 'name="p-storageGi"' in html
    assert 'name="p-password"' in html  # may be changed, never shown
    assert 'name="p-version"' not in html and 'name="p-owner"' not in html
    assert SECRET not in html
    # Left empty, it is kept: not the create form's "generated" (which the dialog contradicted).
    dialog = html[html.index('id="dialog-modify"') :]
    dialog = dialog[: dialog.index("</dialog>")]
    assert "Leave empty to keep the password it has." in dialog
    assert "Leave empty to have one generated." not in dialog


def test_a_valid_modify_queues_only_the_changed_values(owner_client, instance):
    response = _modify(owner_client, instance, instances="3", cpu="1", memoryGi="2", storageGi="10")

    assert response.status_code == 302
    modify = Operation.objects.get(verb="modify")
    assert modify.requested == {"instances": 3}
    follow = owner_client.get(response["Location"]).content.decode()
    assert f"Modification of {instance.name} is" in follow


def test_an_invalid_value_is_shown_beside_its_field_and_nothing_is_queued(owner_client, instance):
    response = _modify(owner_client, instance, instances="9")

    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="dialog-modify"' in html and "data-open" in html
    assert 'class="field-error" id="id_p-instances_error"' in html
    assert not Operation.objects.filter(verb="modify").exists()


def test_a_smaller_volume_is_refused_beside_its_field(owner_client, instance):
    stored = instance.parameters["storageGi"]

    response = _modify(owner_client, instance, storageGi=str(stored - 1))

    assert response.status_code == 400
    html = response.content.decode()
    assert 'class="field-error" id="id_p-storageGi_error"' in html
    assert f"Can grow, not shrink: it is {stored} now." in html
    assert not Operation.objects.filter(verb="modify").exists()


def test_nothing_to_change_is_said_in_the_dialog(owner_client, instance):
    response = _modify(owner_client, instance, instances="2")

    assert response.status_code == 400
    html = response.content.decode()
    assert "The instance already has these values: change one to modify it." in html
    assert "Nothing to change" not in html  # the summary says "Nothing was changed." once
    assert not Operation.objects.filter(verb="modify").exists()


def test_a_modify_changes_from_what_the_queued_ones_leave_and_may_undo_them(owner_client, instance):
    _modify(owner_client, instance, instances="3")  # queued: no worker runs it here

    html = owner_client.get(_url(instance)).content.decode()
    dialog = html[html.index('id="dialog-modify"') :]
    response = owner_client.post(
        _url(instance, "modify/"), {"request_id": "mod-2", "p-instances": "2"}
    )

    assert re.search(r'name="p-instances" value="3"', dialog)  # as the queued one leaves it
    assert response.status_code == 302  # back to the 2 it has: not "nothing to change"
    undo = Operation.objects.filter(verb="modify").order_by("created_at").last()
    assert undo.requested == {"instances": 2}


def test_a_dialog_drawn_before_another_modify_was_queued_does_not_undo_it(owner_client, instance):
    from html import unescape

    html = owner_client.get(_url(instance)).content.decode()  # tab A: 2 servers, 1 core
    shown = unescape(re.search(r'name="shown" value="([^"]*)"', html).group(1))
    other = owner_client.post(_url(instance, "modify/"), {"request_id": "b", "p-instances": "3"})
    assert other.status_code == 302  # tab B queued 3 servers meanwhile

    # Tab A changes the cores only; the servers field still holds the 2 it showed.
    data = {"request_id": "a", "shown": shown, "p-instances": "2", "p-cpu": "2"}
    response = owner_client.post(_url(instance, "modify/"), data)

    assert response.status_code == 302
    modify = Operation.objects.filter(verb="modify").order_by("created_at").last()
    assert modify.requested == {"cpu": 2}  # the 3 servers queued by tab B stand


def test_a_stale_dialog_is_not_refused_for_a_value_it_left_as_shown(owner_client, instance):
    from html import unescape

    html = owner_client.get(_url(instance)).content.decode()  # tab A: 10 GiB
    shown = unescape(re.search(r'name="shown" value="([^"]*)"', html).group(1))
    grown = instance.parameters["storageGi"] + 10
    owner_client.post(_url(instance, "modify/"), {"request_id": "b", "p-storageGi": grown})

    # Tab A changes the cores; its storage field still says what it showed, less than queued.
    data = {"request_id": "a", "shown": shown, "p-cpu": "2",
            "p-storageGi": str(instance.parameters["storageGi"])}  # fmt: skip
    response = owner_client.post(_url(instance, "modify/"), data)

    assert response.status_code == 302, response.content.decode()[:2000]
    assert Operation.objects.filter(verb="modify").order_by("created_at").last().requested == {
        "cpu": 2
    }


def test_a_grow_only_value_a_queued_change_raises_is_named_as_what_it_will_be(
    owner_client, instance
):
    stored = instance.parameters["storageGi"]
    owner_client.post(_url(instance, "modify/"), {"request_id": "up", "p-storageGi": stored + 10})

    response = _modify(owner_client, instance, storageGi=str(stored + 5))

    assert response.status_code == 400
    assert (
        f"Can grow, not shrink: it will be {stored + 10} once the changes queued on it have run."
        in response.content.decode()
    )


@pytest.mark.parametrize("shown", ["[" * 100_000, '{"instances": [[[]]]}', "x" * 200_000, "7"])
def test_a_forged_shown_field_changes_nothing_it_should_not_and_is_no_error(
    owner_client, instance, shown
):
    data = {"request_id": "f", "shown": shown, "p-instances": "3"}

    response = owner_client.post(_url(instance, "modify/"), data)

    assert response.status_code == 302
    assert Operation.objects.get(verb="modify").requested == {"instances": 3}


def test_the_dialogs_cost_now_is_what_runs_now_and_its_queries_do_not_grow_with_the_queue(
    owner_client, instance
):
    def estimate():
        page = owner_client.post(_url(instance, "modify/estimate/"), {"p-instances": "2"})
        return _cell(page.content.decode(), "modify-current-month")

    def page_queries() -> int:
        with CaptureQueriesContext(connection) as queries:
            owner_client.get(_url(instance))
        return len(queries.captured_queries)

    now = estimate()
    owner_client.get(_url(instance))
    few = page_queries()
    for n in range(4):  # queued, never run here
        data = {"request_id": f"q-{n}", "p-instances": n % 2 + 3}
        owner_client.post(_url(instance, "modify/"), data)

    assert estimate() == now  # the instance still runs its 2 servers
    assert page_queries() == few


def test_the_estimate_shows_the_cost_now_and_after_the_change(owner_client, instance):
    response = owner_client.post(_url(instance, "modify/estimate/"), {"p-instances": "4"})

    html = response.content.decode()
    assert response.status_code == 200
    now = _cell(html, "modify-current-month")
    after = _cell(html, "modify-new-month")
    # every dimension counts per server (each amount is rounded to the cent)
    assert float(after) == pytest.approx(2 * float(now), abs=0.02)


def test_the_modify_estimate_prices_at_the_tenants_override(owner_client, instance):
    from datetime import timedelta

    from django.utils import timezone

    from billing.models import PlanOverride

    before = owner_client.post(_url(instance, "modify/estimate/"), {"p-instances": "4"})
    PlanOverride.objects.create(
        tenant=instance.tenant, plan=instance.plan_version.plan,
        prices={"cpu": "0", "memory": "0", "storage": "0"},
        effective_from=timezone.now() - timedelta(minutes=1),
    )  # fmt: skip

    after = owner_client.post(_url(instance, "modify/estimate/"), {"p-instances": "4"})

    assert float(_cell(before.content.decode(), "modify-new-month")) > 0
    for cell in ("modify-current-month", "modify-new-month"):
        assert _cell(after.content.decode(), cell) == "0.00"


def _cell(html: str, cell_id: str) -> str:
    return html.split(f'id="{cell_id}">', 1)[1].split("<", 1)[0]


def test_a_viewer_sees_no_modify_and_a_forged_post_is_refused_and_audited(
    client, instance, add_member
):
    viewer = add_member("viewer@example.com", "viewer")
    client.force_login(viewer)

    assert "dialog-modify" not in client.get(_url(instance)).content.decode()
    for values in ({"instances": "3"}, {"instances": "not a number"}):
        assert _modify(client, instance, **values).status_code == 403

    assert not Operation.objects.filter(verb="modify").exists()
    assert (
        AuditEvent.objects.filter(
            action="instance.modify", result="denied", actor=viewer, target_id=instance.pk
        ).count()
        == 2
    )


def test_a_state_that_forbids_modify_disables_it_with_the_reason(owner_client, instance):
    Instance.objects.filter(pk=instance.pk).update(state=Instance.State.STOPPED)

    html = owner_client.get(_url(instance)).content.decode()

    assert 'data-dialog="dialog-modify" disabled aria-describedby="why-modify"' in html
    assert '<li id="why-modify"><strong>Modify:</strong>' in html
    assert 'id="dialog-modify"' not in html


def test_an_htmx_modify_with_an_error_gets_the_page_part_with_the_dialog_open(
    owner_client, instance
):
    response = owner_client.post(
        _url(instance, "modify/"), {"request_id": "hx-mod", "p-instances": "0"},
        HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-page",
    )  # fmt: skip

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith(
        '<title>Operations · orders · Opsdeck</title>\n<div id="instance-page">'
    )
    assert 'id="dialog-modify"' in html and "open data-open" in html
    assert not Operation.objects.filter(verb="modify").exists()


def test_the_polled_timeline_leaves_the_header_and_the_dialogs_out(owner_client, instance):
    response = owner_client.get(
        _url(instance), {"tab": "operations"},
        HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-operations",
    )  # fmt: skip

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="instance-operations"')
    assert 'id="instance-head"' not in html  # the header follows the operation itself
    assert 'data-dialog="dialog-modify"' not in html and 'id="dialog-modify"' not in html


@pytest.mark.parametrize("shown", ["", "?tab=backups"])
def test_a_modify_refused_in_its_dialog_keeps_the_tab_the_page_showed(
    owner_client, instance, shown
):
    """Sent from the Overview, the dialog came back open over the Operations tab, while the
    address still said the Overview (htmx pushes no address for a form shown again)."""
    page = _url(instance)
    response = owner_client.post(
        _url(instance, "modify/"), {"request_id": "hx-mod", "p-instances": "0"},
        HTTP_HX_REQUEST="true", HTTP_HX_TARGET="instance-page",
        HTTP_HX_CURRENT_URL=f"http://testserver{page}{shown}",
    )  # fmt: skip

    html = response.content.decode()
    tab = "backups" if shown else "overview"
    assert response.status_code == 200 and "HX-Push-Url" not in response
    assert f'id="tab-{tab}" href="{page}?tab={tab}"' in html
    assert re.search(f'id="tab-{tab}"[^>]*aria-current="page"', html)
    assert not re.search('id="tab-operations"[^>]*aria-current="page"', html)
    assert 'id="dialog-modify"' in html and "open data-open" in html
