"""Forms generated from a plan's `apiParameters`: one builder for create, modify and custom verbs.

A generated field only renders and collects what was typed; every check is the service's own
(`deployments.spec.params.validate_parameters`), so the form says exactly what the service
would. Parameter fields are named `p-<key>` so no parameter can clash with a field of the form
itself (the instance's name, its cell, the request id).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from django import forms
from django.core.exceptions import ValidationError

from deployments.models import Cell
from deployments.spec.model import Parameter
from deployments.spec.params import (
    ParameterErrors,
    coerce,
    format_value,
    number_text,
    validate_parameters,
)

FIELD_PREFIX = "p-"
OTHER_GROUP = "Other settings"
GENERATED_HELP = "Leave empty to have one generated."
CHANGED_HELP = "Leave empty to keep the password it has."


def field_name(key: str) -> str:
    return FIELD_PREFIX + key


@dataclass
class FieldGroup:
    """A heading and the bound fields under it."""

    name: str
    fields: list[forms.BoundField]


SHOWN = "shown"  # the hidden field holding the values a modify form was drawn with
SHOWN_MAX = 100_000  # characters of it read; a longer one is ignored


def _same(parameter: Parameter, text: Any, shown: Any) -> bool:
    """Whether a submitted field's text is the value the form showed."""
    try:
        return coerce(parameter, text) == shown
    except ValueError:
        return False  # not of its type: checked, and refused, as any other


class ParameterForm(forms.Form):
    """A form over some parameters; set up by `parameter_form_class`.

    Once valid, `given` holds what was typed (empty fields left out, for the service to fill
    in as it always does) and `values` every parameter's typed value as the service will see
    it (defaults and generated passwords included).
    """

    parameters: list[Parameter] = []
    shown: list[Parameter] = []
    groups_spec: list[dict] = []
    current: dict | None = None
    current_is: str = "it is {} now"  # how a refusal names a current value

    def clean(self) -> dict:
        data = super().clean()
        self.given, self.values = {}, None
        drawn = self.shown_values() if SHOWN in self.data else {}
        for parameter in self.shown:
            value = data.get(field_name(parameter.key))
            if parameter.type == "Boolean" or (isinstance(value, str) and value.strip()):
                if parameter.key in drawn and _same(parameter, value, drawn[parameter.key]):
                    continue  # left as the form showed it: not asked for, nor checked again
                self.given[parameter.key] = value
        try:
            self.values = validate_parameters(
                self.parameters, self.given, current=self.current, current_is=self.current_is
            )
        except ParameterErrors as exc:
            for key, message in exc.errors.items():
                self.add_error(field_name(key) if field_name(key) in self.fields else None, message)
        return data

    @property
    def shown_json(self) -> str:
        """The values the form showed when it was first drawn, sent back with it (`shown`):
        what a submission's changes are measured from (`shown_values`). Never a password."""
        if self.is_bound and isinstance(self.data.get(SHOWN), str):
            return self.data[SHOWN]
        current = self.current or {}
        return json.dumps({
            p.key: current[p.key] for p in self.shown if p.type != "Password" and p.key in current
        })  # fmt: skip

    def shown_values(self) -> dict:
        """The instance's values as the form showed them: `current`, with those the form was
        drawn with when it sent them (another request may have queued changes since)."""
        current = dict(self.current or {})
        text = self.data.get(SHOWN) or "{}"
        try:
            drawn = json.loads(text) if len(text) <= SHOWN_MAX else {}
        except (TypeError, ValueError, RecursionError):
            drawn = {}
        if isinstance(drawn, dict):
            current |= {key: value for key, value in drawn.items() if key in current}
        return current

    @property
    def asks_passwords(self) -> bool:
        """Whether it shows a password field (which, left empty, keeps the password)."""
        return any(p.type == "Password" for p in self.shown)

    def field_groups(self) -> list[FieldGroup]:
        """The parameter fields under the spec's headings (`x-opsdeck.display.groups`), then the
        ones no group lists under "Other settings"."""
        shown = {p.key for p in self.shown}
        groups, placed = [], set()
        for group in self.groups_spec:
            keys = [k for k in group.get("parameters", []) if k in shown and k not in placed]
            if keys:
                groups.append(
                    FieldGroup(str(group.get("name", "")), [self[field_name(k)] for k in keys])
                )
                placed.update(keys)
        rest = [self[field_name(p.key)] for p in self.shown if p.key not in placed]
        if rest:
            groups.append(FieldGroup(OTHER_GROUP, rest))
        return groups

    def errors_from(self, exc: ValidationError) -> None:
        """Put a service's ValidationError on the fields it names (parameter keys, `name`,
        `cell`), the rest on the form as a whole."""
        if not hasattr(exc, "error_dict"):
            self.add_error(None, exc)
            return
        for key, messages in exc.message_dict.items():
            if field_name(key) in self.fields:
                target = field_name(key)
            elif key in self.fields and not key.startswith(FIELD_PREFIX):
                target = key
            else:
                target = None
            for message in messages:
                self.add_error(target, message)


def parameter_field(parameter: Parameter, *, initial: Any = None) -> forms.Field:
    """The form field of one parameter (its checks are left to `validate_parameters`)."""
    limits = parameter.limits or {}
    attrs: dict[str, Any] = {}
    if parameter.required and parameter.type != "Boolean":
        attrs["required"] = True  # announced to screen readers; the form itself is novalidate
    help_text = parameter.description
    common = {"label": parameter.name or parameter.key, "required": False}
    if parameter.type == "Boolean":
        return forms.BooleanField(
            **common, help_text=help_text, initial=bool(initial), widget=forms.CheckboxInput(attrs)
        )
    text = format_value(parameter, initial) if initial is not None else ""
    if parameter.options:
        choices = [(option, option) for option in parameter.options]
        if not parameter.required and text == "":
            choices.insert(0, ("", "—"))
        widget = forms.Select(attrs, choices=choices)
    elif parameter.type == "Float64":
        attrs["step"] = number_text(parameter.step) if parameter.step is not None else "any"
        for bound in ("min", "max"):
            if isinstance(limits.get(bound), int | float):
                attrs[bound] = number_text(limits[bound])
        attrs["inputmode"] = "numeric" if parameter.step == 1 else "decimal"
        widget = forms.NumberInput(attrs)
    elif parameter.type == "Password":
        attrs["autocomplete"] = "new-password"
        widget = forms.PasswordInput(attrs, render_value=False)
        if GENERATED_HELP not in help_text:
            help_text = f"{help_text} {GENERATED_HELP}".strip()
        text = ""  # a password is never prefilled
    elif parameter.type == "JSON":
        attrs.update(rows=4, spellcheck="false")
        widget = forms.Textarea(attrs)
    else:
        if isinstance(limits.get("max"), int | float):
            attrs["maxlength"] = int(limits["max"])
        widget = forms.TextInput(attrs)
    return forms.CharField(**common, help_text=help_text, initial=text, strip=False, widget=widget)


def parameter_form_class(
    parameters: list[Parameter],
    *,
    groups: list[dict] | None = None,
    current: dict | None = None,
    base: type[ParameterForm] = ParameterForm,
    extra_fields: dict[str, forms.Field] | None = None,
    current_is: str = "it is {} now",
    starts: dict | None = None,
) -> type[ParameterForm]:
    """A form class for `parameters` (a plan's or a custom verb's).

    Without `current` it is a create form: every parameter, initial values from the defaults.
    With `current` (the instance's typed values) it is a modify form: only the modifiable
    parameters, initial values from `current` (never a password); validated as a modify.
    `extra_fields` are added as they are (e.g. a create form's choice of cell). `starts`: values
    a create form's parameters start from instead of their defaults.
    """
    shown = [p for p in parameters if current is None or p.modifiable]
    fields = dict(extra_fields or {})
    for parameter in shown:
        if current is None:
            initial = (starts or {}).get(parameter.key, parameter.default)
        else:
            initial = current.get(parameter.key)
        if parameter.type == "Password":
            initial = None
        field = parameter_field(parameter, initial=initial)
        if parameter.type == "Password" and current is not None:  # a modify keeps it
            described = parameter.description.replace(GENERATED_HELP, "").strip()
            field.help_text = f"{described} {CHANGED_HELP}".strip()
        fields[field_name(parameter.key)] = field
    attributes = {
        **fields,
        "parameters": list(parameters),
        "shown": shown,
        "groups_spec": [g for g in (groups or []) if isinstance(g, dict)],
        "current": current,
        "current_is": current_is,
    }
    return type("GeneratedParameterForm", (base,), attributes)


class InstanceCreateForm(ParameterForm):
    """A new instance: its name, where it runs, and the plan's parameters."""

    # The service checks the length, with its own message; the browser keeps it short too.
    name = forms.CharField(
        label="Instance name",
        required=False,
        widget=forms.TextInput({"maxlength": 100, "required": True, "autocomplete": "off"}),
    )
    request_id = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)

    def clean_name(self) -> str:
        name = self.cleaned_data["name"].strip()
        if not name:
            raise ValidationError("Give the instance a name.")
        return name


def instance_create_form_class(
    parameters: list[Parameter], *, groups: list[dict], cells: list[Cell], chosen: bool = False
) -> type[InstanceCreateForm]:
    """The create form of a plan; a choice of cell ("Region") when more than one is offered,
    or when the form sent one (`chosen`): a region withdrawn since is refused beside it."""
    extra = {}
    if len(cells) > 1 or (chosen and cells):
        extra["cell"] = CellChoiceField(
            label="Region",
            queryset=Cell.objects.filter(pk__in=[c.pk for c in cells]),
            initial=next((c.pk for c in cells if c.is_default), cells[0].pk),
            empty_label=None,
            help_text="Where the instance runs. It cannot be moved later.",
            error_messages={
                "invalid_choice": "This region is no longer offered to your organization: "
                "choose another."
            },
        )
    return parameter_form_class(
        parameters, groups=groups, base=InstanceCreateForm, extra_fields=extra
    )


class CellChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, obj: Cell) -> str:
        return f"{obj.region} ({obj.name})" if obj.region else obj.name


KEPT_HELP = "Leave empty to keep the backed-up instance's password."


class RestoreForm(InstanceCreateForm):
    """A new instance from a snapshot: its name, the parameters (the snapshot's, the fixed ones
    read-only) and, where the plan can, a point in time. The service checks the parameters
    against the snapshot's, so its messages are the ones shown."""

    def clean(self) -> dict:
        data = forms.Form.clean(self)
        self.given = {}
        for parameter in self.shown:
            value = data.get(field_name(parameter.key))
            if parameter.type == "Boolean" or (isinstance(value, str) and value.strip()):
                self.given[parameter.key] = value
        return data


def restore_form_class(
    parameters: list[Parameter],
    *,
    groups: list[dict],
    snapshot_values: dict,
    point_in_time: tuple[str, str] | None = None,
) -> type[RestoreForm]:
    """The restore form of a snapshot: every parameter prefilled from `snapshot_values` (never a
    password), those that cannot change after creation read-only; with `point_in_time` (the
    bounds, as `datetime-local` values) an optional "Point in time", read as UTC."""
    extra: dict[str, forms.Field] = {}
    if point_in_time is not None:
        extra["target_time"] = forms.DateTimeField(
            label="Point in time (UTC)",
            required=False,
            input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%dT%H:%M:%S"],
            help_text=f"In UTC, from {point_in_time[0].replace('T', ' ')} to "
            f"{point_in_time[1].replace('T', ' ')}: what the backups can recover; a value below "
            "left as the backup holds it is then the instance's at that time. Leave empty to "
            "restore the backup as it was taken.",
            widget=forms.DateTimeInput(
                {
                    "type": "datetime-local",
                    "min": point_in_time[0],
                    "max": point_in_time[1],
                    "step": 1,
                },
                format="%Y-%m-%dT%H:%M:%S",
            ),
        )
    fields = dict(extra)
    for parameter in parameters:
        initial = snapshot_values.get(parameter.key, parameter.default)
        if parameter.type == "Password":
            initial = None
        field = parameter_field(parameter, initial=initial)
        if parameter.type == "Password":
            # A restore keeps the source's passwords; the generated one is for a fresh create.
            described = parameter.description.replace(GENERATED_HELP, "").strip()
            field.help_text = f"{described} {KEPT_HELP}".strip()
        elif not parameter.modifiable:
            # Fixed by the snapshot: shown, sent back as it is, refused by the service if changed.
            field = forms.CharField(
                label=field.label,
                required=False,
                strip=False,
                initial=format_value(parameter, initial) if initial is not None else "",
                help_text="Fixed by the backup.",
                widget=forms.TextInput({"readonly": True}),
            )
        fields[field_name(parameter.key)] = field
    attributes = {
        **fields,
        "parameters": list(parameters),
        "shown": list(parameters),
        "groups_spec": [g for g in (groups or []) if isinstance(g, dict)],
        "current": snapshot_values,
    }
    return type("GeneratedRestoreForm", (RestoreForm,), attributes)
