"""The admin site every model admin (ours, auth's, allauth's, beat's) is registered on, with
a guard on what its lists are asked: Django answers most wrong input there itself (a filter
on a word where a number goes sends the list back unfiltered), but not two, which failed with
a server error on every list.

- A year outside 1 to 9998 in a filter (`?created_at__year=10000`, or the date drill-down's
  9999, whose end falls past the calendar's last day): the list comes back unfiltered with
  Django's `?e=1`, as for any filter it cannot apply.
- An action posted with a selected id that is no id of the list's model (`abc` where ids are
  numbers): nothing is done, and the list says so.
"""

from __future__ import annotations

import functools
import re

from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.views.main import ERROR_FLAG
from django.core.exceptions import ValidationError
from django.http import HttpResponseRedirect

_YEAR = re.compile(r"[0-9]{1,4}")
FIRST_YEAR, LAST_YEAR = 1, 9998  # the drill-down into a year reads up to the next one's start


class OpsdeckAdminSite(admin.AdminSite):
    site_header = "Opsdeck administration"
    site_title = "Opsdeck admin"

    def index(self, request, extra_context=None):
        """The staff's home also says how many emails wait for the mail worker, and how many it
        gave up on: only the Procfile's `mail` process sends them, and one not running (left
        out of a deployment made before it existed) or a mail server refusing them would
        otherwise go unnoticed."""
        return super().index(request, {**_mail_counts(), **(extra_context or {})})

    def admin_view(self, view, cacheable=False):
        return super().admin_view(_guarded(view), cacheable)


def _mail_counts() -> dict[str, int]:
    from django.db.models import Count, Q

    from accounts.models import OutgoingEmail

    return OutgoingEmail.objects.aggregate(
        mail_waiting=Count("pk", filter=Q(given_up_at=None)),
        mail_given_up=Count("pk", filter=Q(given_up_at__isnull=False)),
    )


def _guarded(view):
    # A model admin's views are its bound methods: the selection is checked against its model.
    model_admin = getattr(view, "__self__", None)
    model = model_admin.model if isinstance(model_admin, admin.ModelAdmin) else None

    @functools.wraps(view)
    def guarded(request, *args, **kwargs):
        if _year_out_of_range(request.GET):
            return HttpResponseRedirect(f"{request.path}?{ERROR_FLAG}=1")
        if model is not None and request.method == "POST" and not _ids_of(model, request.POST):
            messages.warning(
                request, "The selection names no item of this list, so nothing was changed."
            )
            return HttpResponseRedirect(request.get_full_path())
        return view(request, *args, **kwargs)

    return guarded


def _year_out_of_range(query) -> bool:
    """Whether a filter asks for a year the database's dates cannot bound."""
    for key, values in query.lists():
        if {"year", "iso_year"}.isdisjoint(key.split("__")):
            continue
        for value in values:
            if _YEAR.fullmatch(value) is None or not FIRST_YEAR <= int(value) <= LAST_YEAR:
                return True
    return False


def _ids_of(model, posted) -> bool:
    """Whether every selected id an action was posted with is one of `model`'s (none posted:
    nothing to check). A text id holding a null character is none: PostgreSQL cannot compare
    text holding one."""
    field = model._meta.pk
    try:
        for value in posted.getlist(ACTION_CHECKBOX_NAME):
            if "\x00" in value:
                return False
            field.to_python(value)
    except ValidationError:
        return False
    return True
