from django import forms
from django.core.exceptions import ValidationError

from accounts.text import organization_name_plain
from billing import invoicing
from billing.countries import COUNTRIES
from billing.models import BillingProfile, CreditNote, Invoice
from billing.tax_ids import TAX_ID_CHOICES


class InvoiceFilterForm(forms.Form):
    """The billing team's invoice filters; a bad field is flagged and the others still apply."""

    status = forms.ChoiceField(
        required=False, choices=[("", "Any"), *Invoice.Status.choices], label="Status"
    )
    period = forms.RegexField(
        required=False,
        regex=r"^[0-9]{4}-(0[1-9]|1[0-2])$",
        label="Period",
        error_messages={"invalid": "Write the month as YYYY-MM."},
        widget=forms.TextInput({"placeholder": "2026-11", "inputmode": "numeric"}),
    )
    tenant = forms.CharField(required=False, max_length=200, label="Organization")
    # At most what an invoice's total holds (a larger number is no amount, and overflows the
    # database's comparison).
    min_total = forms.DecimalField(
        required=False, min_value=0, max_digits=19, decimal_places=3, label="Total at least"
    )
    max_total = forms.DecimalField(
        required=False, min_value=0, max_digits=19, decimal_places=3, label="Total at most"
    )

    def clean_tenant(self):
        return organization_name_plain(self.cleaned_data["tenant"])  # as names are stored

    def clean_period(self):
        period = self.cleaned_data["period"]
        if period:
            try:
                invoicing.period_clean(period)
            except ValidationError as exc:
                raise ValidationError("Write a month as YYYY-MM, from 1970 on.") from exc
        return period

    def clean(self):
        data = super().clean()
        low, high = data.get("min_total"), data.get("max_total")
        if low is not None and high is not None and low > high:
            self.add_error("max_total", "The upper amount is below the lower one.")
        return data


class CreditNoteForm(forms.Form):
    """A credit note the billing team issues on an Opsdeck invoice: what makes it too much or
    of the wrong shape for the invoice is the service's to say (`invoicing.credit_note_check`).
    Sent once to be checked and shown back for confirmation (`confirmed` empty), then again
    to be issued."""

    amount = forms.DecimalField(
        label="Amount",
        error_messages={
            "required": "Enter the amount to credit.",
            "invalid": "Enter the amount as a number, e.g. 10.00.",
        },
        widget=forms.TextInput({"inputmode": "decimal", "autocomplete": "off"}),
    )
    reason = forms.ChoiceField(
        label="Reason",
        choices=[("", "Choose a reason"), *CreditNote.LOCAL_REASONS.items()],
        error_messages={"required": "Choose a reason.", "invalid_choice": "Choose a reason."},
    )
    memo = forms.CharField(
        label="Memo",
        required=False,
        max_length=invoicing.MEMO_MAX,
        widget=forms.Textarea({"rows": 3}),
        help_text="Printed on the credit note and in the email to the organization.",
        error_messages={"max_length": "Use at most %(limit_value)d characters (this has "
                        "%(show_value)d)."},
    )  # fmt: skip
    refund = forms.TypedChoiceField(
        label="How is it settled?",
        choices=[
            ("credit", "Credited: it lowers what is due, or is set against a later invoice"),
            ("refund", "Refunded outside Opsdeck: the money goes back, e.g. by bank transfer"),
        ],
        coerce=lambda value: value == "refund",
        initial="credit",
        widget=forms.RadioSelect,
        error_messages={"required": "Choose how it is settled."},
    )
    request_id = forms.CharField(max_length=64, required=False, widget=forms.HiddenInput)
    confirmed = forms.BooleanField(required=False, widget=forms.HiddenInput)


def _field_of(
    name: str, form_field: type[forms.Field], autocomplete: str = "", help_text: str = ""
) -> forms.Field:
    """A form field labelled and bounded as the profile's model field is."""
    model_field = BillingProfile._meta.get_field(name)
    field = form_field(
        label=model_field.verbose_name,
        max_length=model_field.max_length,
        required=not model_field.blank,
        help_text=help_text,
    )
    if autocomplete:
        field.widget.attrs["autocomplete"] = autocomplete
    return field


class BillingDetailsForm(forms.Form):
    """Whom invoices are made out to; the rules that join fields (an address needs its first
    line, city and country; a tax ID's shape) are the profile's own (`BillingProfile.clean`),
    applied by the service."""

    legal_name = _field_of(
        "legal_name",
        forms.CharField,
        "organization",
        "As registered; it starts as the organization's name.",
    )
    email = _field_of(
        "email", forms.EmailField, "email", "Printed on invoices; with Stripe, where it sends them."
    )
    line1 = _field_of("line1", forms.CharField, "address-line1")
    line2 = _field_of("line2", forms.CharField, "address-line2")
    city = _field_of("city", forms.CharField, "address-level2")
    postal_code = _field_of("postal_code", forms.CharField, "postal-code")
    state = _field_of("state", forms.CharField, "address-level1")
    country = forms.ChoiceField(
        label="Country",
        required=False,
        choices=[("", "Choose a country"), *COUNTRIES],
        widget=forms.Select(attrs={"autocomplete": "country"}),
    )
    tax_id_type = forms.ChoiceField(
        label="Tax ID type", required=False, choices=[("", "No tax ID"), *TAX_ID_CHOICES]
    )
    tax_id_value = _field_of(
        "tax_id_value",
        forms.CharField,
        "off",
        "As registered, e.g. DE123456789 for an EU VAT number.",
    )
