"""allauth's sign-up and password-reset forms, with one rule of Opsdeck's: an email address no
one has confirmed belongs to no one yet.

allauth counts every address a user has added on their Email page, confirmed or not, as theirs.
Adding someone else's address (a typo, or on purpose) would then stop its owner from ever signing
up (the sign-up page says an email was sent, and nothing is made), and would send that owner
password-reset links for the account that added it. Here such an address does neither: whoever
signs up with it and confirms it gets it (`services.email_address_claim` drops the unconfirmed
copies when the account is saved), and a reset goes only to an address its account signs in with
or has confirmed.

(A module of its own: allauth's forms module imports `ACCOUNT_SIGNUP_FORM_CLASS` from
`accounts.forms` while it loads.)
"""

from allauth.account.adapter import get_adapter
from allauth.account.forms import ResetPasswordForm, SignupForm
from allauth.account.models import EmailAddress
from django.db import IntegrityError, transaction
from django.http import HttpRequest

from accounts import selectors


class AccountSignupForm(SignupForm):
    def validate_unique_email(self, value: str) -> str:
        if selectors.email_address_unclaimed(value):
            self.account_already_exists = False
            return get_adapter().validate_unique_email(value)
        return super().validate_unique_email(value)

    def try_save(self, request: HttpRequest):
        """As allauth's; a sign-up that lost a race for its address to another one at the same
        moment (a double click) is answered as a sign-up with a taken address is, not with a
        500: the address is one account's (`User.email` is unique)."""
        try:
            with transaction.atomic():
                return super().try_save(request)
        except IntegrityError:
            if selectors.email_address_unclaimed(self.cleaned_data["email"]):
                raise  # not the address: something else is wrong
            self.account_already_exists = True
            return super().try_save(request)


class AccountResetPasswordForm(ResetPasswordForm):
    def clean_email(self) -> str:
        email = super().clean_email()
        self.users = [
            user
            for user in self.users
            if user.email.lower() == email.lower()
            or EmailAddress.objects.filter(user=user, email__iexact=email, verified=True).exists()
        ]
        return email
