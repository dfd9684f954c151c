"""A small stateful Stripe for tests and offline development, served over HTTP on loopback."""

from .api import StripeEmulator
from .errors import StripeError
from .persistence import StateFileError
from .state import API_VERSION
from .webhooks import sign

__all__ = ["API_VERSION", "StateFileError", "StripeEmulator", "StripeError", "sign"]
