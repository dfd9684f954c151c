"""The sandbox cluster: a Kubernetes API server emulator with a simulated CloudNativePG operator."""

from .api import Sandbox

__all__ = ["Sandbox"]
