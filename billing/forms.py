from django import forms
from django.core.exceptions import ValidationError

from billing import invoicing
from billing.models import Invoice


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
        required=False, min_value=0, max_digits=18, decimal_places=2, label="Total at least"
    )
    max_total = forms.DecimalField(
        required=False, min_value=0, max_digits=18, decimal_places=2, label="Total at most"
    )

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
