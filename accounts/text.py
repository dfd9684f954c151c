"""What people can see of a text a user typed."""

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
