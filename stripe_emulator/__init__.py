"""A small stateful Stripe for tests and offline development, served over HTTP on loopback."""

from .api import StripeEmulator
from .errors import StripeError
from .state import API_VERSION
from .webhooks import sign

__all__ = ["API_VERSION", "StripeEmulator", "StripeError", "sign"]
