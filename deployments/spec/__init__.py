"""Service plan specs: loading, validation and typed parameter validation (no Django)."""

from deployments.spec.loader import SpecError, load_spec
from deployments.spec.params import ParameterErrors, validate_parameters
from deployments.spec.validation import ValidationResult, validate

__all__ = [
    "ParameterErrors",
    "SpecError",
    "ValidationResult",
    "load_spec",
    "validate",
    "validate_parameters",
]
