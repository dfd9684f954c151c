"""allauth's sign-up, sign-in, add-email and password-reset forms, with one rule of Opsdeck's:
an email address no one has confirmed belongs to no one yet.

allauth counts every address a user has added on their Email page, confirmed or not, as theirs.
Adding someone else's address (a typo, or on purpose) would then stop its owner from ever signing
up (the sign-up page says an email was sent, and nothing is made), and would send that owner
password-reset links for the account that added it. Here such an address does neither: anyone
may sign up with it, and signing up or confirming it drops the other accounts' unconfirmed copies
(`services.email_address_claim`, called by the adapter and on `email_confirmed`); a reset goes
only to an address its account signs in with or has confirmed; no one can add, or confirm, an
address another account signs in with or owns.

(A module of its own: allauth's forms module imports `ACCOUNT_SIGNUP_FORM_CLASS` from
`accounts.forms` while it loads.)
"""

from allauth.account.adapter import get_adapter
from allauth.account.forms import (
    AddEmailForm,
    LoginForm,
    ReauthenticateForm,
    ResetPasswordForm,
    SignupForm,
)
from allauth.mfa.base.forms import ReauthenticateForm as CodeReauthenticateForm
from allauth.mfa.utils import is_mfa_enabled
from django import forms
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.http import HttpRequest

from accounts import selectors, services
from accounts.errors import ActionDenied
from accounts.text import NOT_INTERNET, email_reaches_someone


class AccountSignupForm(SignupForm):
    def clean(self) -> dict:
        """As allauth's; two passwords that differ are said with the first one's other errors
        (allauth compares them only once the first one is accepted), so one submit says all
        there is to change."""
        cleaned = super().clean()
        typed, again = self.data.get("password1"), self.data.get("password2")
        if typed and again and typed != again and "password2" not in self.errors:
            self.add_error("password2", "You must type the same password each time.")
        return cleaned

    def clean_email(self) -> str:
        """As allauth's; an address mail cannot reach (`localhost`) is refused: the account's
        confirmation would go nowhere."""
        email = super().clean_email()
        if not email_reaches_someone(email):
            raise ValidationError(NOT_INTERNET)
        return email

    def validate_unique_email(self, value: str) -> str:
        if selectors.email_address_unclaimed(value):
            self.account_already_exists = False
            return get_adapter().validate_unique_email(value)
        return super().validate_unique_email(value)

    def try_save(self, request: HttpRequest):
        """As allauth's; a sign-up that lost a race for its address to another one at the same
        moment (a double click) is answered as a sign-up with a taken address is, not with a
        500: the address is one account's (`User.email` is unique). Any other constraint a
        sign-up breaks is a bug, and still raised."""
        try:
            with transaction.atomic():
                return super().try_save(request)
        except IntegrityError:
            if selectors.email_address_unclaimed(self.cleaned_data["email"]):
                raise  # not the address: something else is wrong
            self.account_already_exists = True
            return super().try_save(request)


class AccountLoginForm(LoginForm):
    def clean_login(self) -> str:
        """As allauth's; the address as the other forms take it (the adapter's `clean_email`):
        one typed as at sign-up (a full-width letter) signs in to the account it made. Text
        that is no address is left for allauth to refuse as it does."""
        login = super().clean_login()
        try:
            return get_adapter().clean_email(login)
        except ValidationError:
            return login


class AccountAddEmailForm(AddEmailForm):
    def clean_email(self) -> str:
        """As allauth's; an address mail cannot reach is refused, as at sign-up; an address
        another account signs in with or has confirmed is refused too:
        its confirmation email would reach that account's owner, who might follow it, and
        then could no longer confirm their own. (This tells a signed-in user that the address
        has an account, which sign-up and password reset never say.)"""
        email = super().clean_email()
        if not email_reaches_someone(email):
            raise ValidationError(NOT_INTERNET)
        if not selectors.email_address_unclaimed(email, besides=self.user):
            raise ValidationError("This address belongs to another account: add one only you use.")
        return email


class AccountResetPasswordForm(ResetPasswordForm):
    def clean_email(self) -> str:
        """The address as sign-up and sign-in take it (`AccountAdapter.clean_email`: a
        full-width letter is that letter): allauth's form finds its account by it, then mails
        the address as typed, and a look-alike was told it had no account."""
        super().clean_email()
        email = get_adapter().clean_email(self.cleaned_data["email"].lower())
        self.users = [
            user
            for user in self.users
            if user.email.lower() == email.lower() or selectors.email_address_confirmed(user, email)
        ]
        return email


class AccountDeleteForm(forms.Form):
    """Deleting one's own account (`services.user_delete`): the address typed, the password
    and, with two-factor authentication on, a code from the authenticator app or a recovery
    code, each checked as allauth's reauthentication checks it (failed attempts count against
    the sign-in limits; a refused code is recorded). Checked in that order, each only once the
    ones before it hold, and the code only once the deletion would not be refused now
    (`services.user_delete_precheck`), under the deletion's locks
    (`services.user_delete_lock`), which its view's transaction holds until the deletion: what
    was checked cannot change before it, so a recovery code is used up only by a form that
    deletes. It carries the organizations the page said go with the account."""

    confirm_email = forms.CharField(
        max_length=254,
        widget=forms.TextInput(attrs={"autocomplete": "off"}),
        error_messages={"required": "Type your email address to delete your account."},
    )
    password = forms.CharField(
        label="Your password",
        strip=False,
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
        error_messages={"required": "Enter your password."},
    )
    organizations_deleted = forms.CharField(required=False, widget=forms.HiddenInput)

    def __init__(self, *args, user, actor=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.user = user
        self.actor = actor  # who deletes (the same user), for the refusal's audit event
        self.fields["confirm_email"].label = f"Type {user.email} to confirm"
        if is_mfa_enabled(user):
            self.fields["code"] = forms.CharField(
                label="Code from your authenticator app, or a recovery code",
                max_length=64,
                widget=forms.TextInput(attrs={"autocomplete": "one-time-code"}),
                error_messages={"required": "Enter a code from your authenticator app."},
            )

    def clean_confirm_email(self) -> str:
        typed = self.cleaned_data["confirm_email"]
        try:
            services.account_email_confirm(self.user, typed)
        except ValidationError as exc:
            raise ValidationError(exc.message_dict["confirm_email"]) from None
        return typed

    def clean_organizations_deleted(self) -> list[int]:
        ids = self.cleaned_data["organizations_deleted"].split(",")
        # An id, not just any digits: 5,000 of them are more than int() takes.
        return [int(i) for i in ids if i.isascii() and i.isdigit() and len(i) <= 18]

    def clean(self) -> dict:
        cleaned = super().clean()
        if self.errors:
            return cleaned
        try:
            services.user_delete_lock(self.user)
        except ValidationError as exc:
            self.add_error(None, exc)
            return cleaned
        for field, form in [
            ("password", ReauthenticateForm(user=self.user, data=self.data)),
            ("code", CodeReauthenticateForm(user=self.user, data=self.data)),
        ]:
            if field not in self.fields:
                continue
            if field == "code" and not self._deletes(cleaned):
                break
            if not form.is_valid():
                for error in form.errors.get(field, []) + form.non_field_errors():
                    self.add_error(field, error)
                break
        return cleaned

    def _deletes(self, cleaned: dict) -> bool:
        """Whether the deletion would go ahead now; else its refusal is the form's error."""
        try:
            services.user_delete_precheck(
                actor=self.actor, deleting=cleaned.get("organizations_deleted") or []
            )
        except (ValidationError, ActionDenied) as exc:
            self.add_error(None, exc.reason if isinstance(exc, ActionDenied) else exc)
            return False
        return True
