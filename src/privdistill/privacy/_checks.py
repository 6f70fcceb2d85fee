"""Argument checks shared by the privacy module.

Every failure caused by a user's privacy parameters raises :class:`privdistill.errors.PrivacyError`
with a message that names the argument, the value received and what is allowed.
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any

from privdistill.errors import PrivacyError


def _is_real(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def check_real(name: str, value: Any) -> float:
    if not _is_real(value):
        raise PrivacyError(f"{name} must be a number, got {value!r}")
    value = float(value)
    if math.isnan(value):
        raise PrivacyError(f"{name} must be a number, got NaN")
    return value


def check_positive(name: str, value: Any, *, allow_inf: bool = False) -> float:
    value = check_real(name, value)
    if not value > 0:
        raise PrivacyError(f"{name} must be > 0, got {value!r}")
    if math.isinf(value) and not allow_inf:
        raise PrivacyError(f"{name} must be finite, got {value!r}")
    return value


def check_nonnegative(name: str, value: Any) -> float:
    value = check_real(name, value)
    if value < 0 or math.isinf(value):
        raise PrivacyError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


def check_epsilon(value: Any, name: str = "epsilon") -> float:
    """A privacy parameter epsilon: finite and > 0."""
    return check_positive(name, value)


def check_delta(value: Any, name: str = "delta") -> float:
    """A failure probability delta: strictly inside (0, 1)."""
    value = check_real(name, value)
    if not 0.0 < value < 1.0:
        raise PrivacyError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return value


def check_count(name: str, value: Any, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral):
        if _is_real(value) and float(value).is_integer():
            value = int(value)
        else:
            raise PrivacyError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum:
        raise PrivacyError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> Any:
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise PrivacyError(f"{name} must be one of {allowed}; got {value!r}")
    return value


def check_accounting(value: Any) -> str:
    return check_choice("accounting", value, ("paper", "strict"))
