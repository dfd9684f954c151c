"""What people can see of a text a user typed, and how a name they typed reads."""

import unicodedata

# Letters that show as blank space: Hangul fillers and the blank Braille pattern. Printable to
# Python, so `str.isprintable()` lets them through.
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def text_visible(text: str) -> bool:
    """Whether `text` shows anything: a character other than spaces and blank letters."""
    return any(not char.isspace() and char not in _BLANK_LETTERS for char in text)


NOT_INTERNET = "Enter an address at an internet domain, like name@example.com."


def email_reaches_someone(address: str) -> bool:
    """Whether mail to `address` can reach someone: its domain is an internet name (it has a
    dot), not `localhost` nor a network address in brackets, which Django's check takes."""
    domain = address.rpartition("@")[2]
    return "." in domain and not domain.endswith("]")


# Minus signs and a hyphen bullet, which read as "-" in a name as dashes do.
_MINUSES = frozenset("\u02d7\u2043\u2212\u2796")


def _hyphens_plain(name: str) -> str:
    """Each dash (Unicode's Pd: hyphens, en and em dashes) and minus sign as "-", as it reads:
    a U+2010 hyphen in "orders-db" makes it "orders-db", taken with it. NFKC leaves them be.
    The wide dashes of East Asian text (the wave dash) do not read as "-" and stay."""
    return "".join(
        "-"
        if ch in _MINUSES
        or (unicodedata.category(ch) == "Pd" and unicodedata.east_asian_width(ch) not in "WF")
        else ch
        for ch in name
    )


def name_plain(typed: str) -> str:
    """A name as it reads, as instance names are stored and found: compatibility forms as their
    plain letters (fullwidth "orders" is "orders"), dashes as "-", without spaces around it."""
    return _hyphens_plain(unicodedata.normalize("NFKC", typed)).strip()


def organization_name_plain(typed: str) -> str:
    """An organization name as names are stored: compatibility forms as their plain letters
    (a full-width "A" is "A"), each run of whitespace as one space."""
    return " ".join(unicodedata.normalize("NFKC", typed).split())
