"""The pages Stripe hosts, reduced to what a test or a developer clicks: Checkout's Pay button,
the billing portal's way back, an invoice's page and its PDF."""

from __future__ import annotations

from html import escape
from typing import Any

_STYLE = "body{font-family:sans-serif;max-width:32rem;margin:3rem auto}td{padding:.2rem .6rem}"


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{escape(title)}</h1>{body}"
        "<p><small>Stripe emulator (test mode)</small></p></body></html>"
    )


# Stripe's currencies whose smallest unit is not a hundredth: none (yen), or a thousandth.
ZERO_DECIMAL = frozenset(
    {"bif", "clp", "djf", "gnf", "jpy", "kmf", "krw", "mga"}
    | {"pyg", "rwf", "ugx", "vnd", "vuv", "xaf", "xof", "xpf"}
)
THREE_DECIMAL = frozenset({"bhd", "jod", "kwd", "omr", "tnd"})


def money(amount: int, currency: str) -> str:
    """`12.34 USD`, `1234 JPY`, `1.234 KWD` from an amount in the currency's smallest unit."""
    places = 0 if currency in ZERO_DECIMAL else 3 if currency in THREE_DECIMAL else 2
    return f"{amount / 10**places:.{places}f} {currency.upper()}"


def checkout_page(session: dict[str, Any], items: list[dict[str, Any]]) -> str:
    """The session's line items and a Pay button (a form POST to the same URL)."""
    rows = "".join(
        f"<tr><td>{escape(i['price'].get('nickname') or i['price']['product'])}</td>"
        f"<td>{'metered' if i['quantity'] is None else i['quantity']}</td>"
        f"<td>{escape(money(i['amount'], i['price']['currency']))}</td></tr>"
        for i in items
    )
    cancel = session.get("cancel_url")
    body = (
        f"<table>{rows}</table>"
        f"<p>Due today: {escape(money(session['amount_total'], session['currency']))}</p>"
        f"<form method='post' action='/c/pay/{escape(session['id'])}'>"
        "<button type='submit' name='pay' value='1'>Pay</button></form>"
    )
    if cancel:
        body += f"<p><a href='{escape(cancel)}'>Cancel</a></p>"
    return _page("Subscribe", body)


def checkout_done_page(session: dict[str, Any]) -> str:
    """Shown for a completed session without a success_url."""
    return _page("Payment complete", f"<p>Subscription {escape(session['subscription'])}.</p>")


def checkout_expired_page() -> str:
    """Shown for a session expired before it was paid."""
    return _page("Checkout expired", "<p>This Checkout Session is no longer active.</p>")


def portal_page(session: dict[str, Any], subscriptions: list[dict[str, Any]]) -> str:
    """The customer's subscriptions and a link back to return_url."""
    rows = "".join(
        f"<li>{escape(s['id'])}: {escape(s['status'])}"
        f"{' (cancels at period end)' if s['cancel_at_period_end'] else ''}</li>"
        for s in subscriptions
    )
    back = session.get("return_url")
    link = f"<p><a href='{escape(back)}'>Return</a></p>" if back else ""
    return _page("Billing", f"<ul>{rows}</ul>{link}")


def invoice_page(invoice: dict[str, Any]) -> str:
    """An invoice's hosted page: its lines and its total."""
    return _page(f"Invoice {invoice['number']}", f"<pre>{escape(invoice_text(invoice))}</pre>")


def invoice_text(invoice: dict[str, Any]) -> str:
    """The invoice as lines of text (the page and the PDF show the same)."""
    lines = [
        f"Invoice {invoice['number']} ({invoice['status']})",
        f"Customer {invoice['customer']}",
        *(
            f"{line['description']}: {money(line['amount'], line['currency'])}"
            for line in invoice["lines"]["data"]
        ),
        f"Total {money(invoice['total'], invoice['currency'])}",
    ]
    return "\n".join(lines)


def invoice_pdf(invoice: dict[str, Any]) -> bytes:
    """A one-page PDF of invoice_text."""
    return text_pdf(invoice_text(invoice))


def credit_note_text(credit_note: dict[str, Any]) -> str:
    """A credit note as lines of text (its PDF)."""
    lines = [
        f"Credit note {credit_note['number']} ({credit_note['status']})",
        f"Invoice {credit_note['invoice']}",
        f"Reason {credit_note['reason'] or '-'}",
        f"Total {money(credit_note['total'], credit_note['currency'])}",
    ]
    return "\n".join(lines)


def text_pdf(text: str) -> bytes:
    """A one-page PDF of lines of text (plain ASCII; anything else becomes '?')."""
    text = text.encode("ascii", "replace").decode()
    escaped = [
        t.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)") for t in text.splitlines()
    ]
    stream = "BT /F1 12 Tf 72 760 Td 16 TL " + " ".join(f"({t}) '" for t in escaped) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
        "/Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
    ]
    out = "%PDF-1.4\n"
    offsets = []
    for number, obj in enumerate(objects, start=1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{obj}\nendobj\n"
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n"
    out += "".join(f"{offset:010d} 00000 n \n" for offset in offsets)
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n"
    return out.encode("ascii")
