from django import forms
from django.core.exceptions import ValidationError

from accounts.roles import TOKEN_ROLES, Role
from accounts.services import organization_name_clean


class SignupForm(forms.Form):
    """Extra sign-up fields; django-allauth builds its form on top of this one."""

    organization = forms.CharField(
        label="Organization name",
        max_length=100,
        required=False,
        help_text="Your first organization; you can create more later. Invited to one? "
        "Leave this blank: you join it once you have confirmed your address.",
    )

    def clean_organization(self) -> str:
        """Checked as the organization is when created, so that a name it would refuse (a
        zero-width space pasted with it) is said next to the field, before any user exists."""
        name = self.cleaned_data["organization"]
        if not name:
            return name
        try:
            return organization_name_clean(name)
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["name"]) from None

    def signup(self, request, user) -> None:
        """The organization is created by the account adapter, with the user, atomically."""


# Each says what to do, in the words the services use, not Django's "This field is required."
TOO_LONG = "Use at most %(limit_value)d characters (this has %(show_value)d)."


class OrganizationForm(forms.Form):
    name = forms.CharField(
        label="Organization name",
        max_length=100,
        error_messages={"required": "Give the organization a name.", "max_length": TOO_LONG},
    )
    request_id = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)


class OrganizationRenameForm(OrganizationForm):
    """The new-organization form's name, with its rules (`services.tenant_rename` checks it as
    `tenant_create` does): a rename is no new request."""

    request_id = None


class OrganizationDeleteForm(forms.Form):
    confirm_name = forms.CharField(
        label="Organization name",
        max_length=200,
        error_messages={"required": "Type the organization's name to delete it."},
    )


class InviteForm(forms.Form):
    email = forms.EmailField(
        label="Email address",
        error_messages={
            "required": "Enter the email address of the person to invite.",
            "invalid": "Enter an email address, like name@example.com.",
            "max_length": TOO_LONG,
        },
    )
    role = forms.ChoiceField(
        choices=Role.choices,
        initial=Role.MEMBER,
        error_messages={"invalid_choice": "Choose one of the roles listed."},
    )
    request_id = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)


class RoleForm(forms.Form):
    role = forms.ChoiceField(choices=Role.choices)
    confirm = forms.BooleanField(required=False, widget=forms.HiddenInput)


class AuditFilterForm(forms.Form):
    action = forms.CharField(required=False, label="Action")
    actor = forms.CharField(required=False, label="Actor email")
    since = forms.DateField(required=False, label="From", widget=forms.DateInput({"type": "date"}))
    until = forms.DateField(required=False, label="To", widget=forms.DateInput({"type": "date"}))

    def clean(self):
        data = super().clean()
        if data.get("since") and data.get("until") and data["since"] > data["until"]:
            # Flags "To" (and drops it from the filters); "From" still applies.
            self.add_error("until", "The start date is after the end date.")
        return data


class ApiTokenForm(forms.Form):
    """A new API token: what it is for, its role, and how long it lasts (`expires_in_days`)."""

    EXPIRIES = [("30", "In 30 days"), ("90", "In 90 days"), ("365", "In a year"), ("", "Never")]

    name = forms.CharField(
        label="Token name",
        max_length=100,
        error_messages={
            "required": "Enter a name that says what the token is for.",
            "max_length": TOO_LONG,
        },
    )
    # The page's: sent again (a reload of the page showing the secret), it makes no second token.
    request_id = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)
    role = forms.ChoiceField(
        choices=[(r.value, r.label) for r in TOKEN_ROLES],
        initial=Role.MEMBER,
        error_messages={"invalid_choice": "Choose one of the roles listed."},
    )
    expires = forms.ChoiceField(
        label="Expires",
        choices=EXPIRIES,
        initial="90",
        required=False,
        error_messages={"invalid_choice": "Choose one of the expiries listed."},
    )

    @property
    def expires_in_days(self) -> int | None:
        days = self.cleaned_data.get("expires")
        return int(days) if days else None
