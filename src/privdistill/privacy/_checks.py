"""Argument checks shared by the privacy module.

Every failure caused by a user's privacy parameters raises :class:`privdistill.errors.PrivacyError`
with a message that names the argument, the value received and what is allowed.
"""

from __future__ import annotations

import math
import warnings
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


def check_positive(name: str, value: Any) -> float:
    value = check_real(name, value)
    if not value > 0:
        raise PrivacyError(f"{name} must be > 0, got {value!r}")
    if math.isinf(value):
        raise PrivacyError(f"{name} must be finite, got {value!r}")
    return value


def check_delta(value: Any, name: str = "delta") -> float:
    """A failure probability delta: strictly inside (0, 1)."""
    value = check_real(name, value)
    if not 0.0 < value < 1.0:
        raise PrivacyError(f"{name} must lie strictly between 0 and 1, got {value!r}")
    return value


class DeltaWarning(UserWarning):
    """δ is below 1/N but not well below it (above 1/(10 N)): allowed, and said."""


def check_delta_for_records(delta: float, records: int) -> None:
    """δ against the N private training records, before any work: δ ≥ 1/N is refused (PrivacyError), δ above
    1/(10 N) warned. A mechanism that publishes each record outright with probability δ is (0, δ)-DP: at δ ≥ 1/N it
    would expose about δN ≥ 1 whole records while meeting the guarantee, which then protects nothing."""
    if records <= 0:
        return
    exposed = delta * records
    if delta >= 1.0 / records:
        raise PrivacyError(f"delta {delta:g} is not below 1/N = {1.0 / records:.3g} for the N = {records} private "
                           "training records: a mechanism that publishes each record outright with probability delta "
                           f"meets (epsilon, delta)-DP and would expose about {exposed:.3g} of them, so the guarantee "
                           f"would protect nothing; choose --delta well below 1/N, at most 1/(10 N) = "
                           f"{0.1 / records:.3g}")
    if delta > 0.1 / records:
        warnings.warn(f"delta {delta:g} is above 1/(10 N) = {0.1 / records:.3g} for the N = {records} private "
                      f"training records: the guarantee would allow publishing about {exposed:.2g} whole records; "
                      "a delta well below 1/N is the usual choice (--delta)", DeltaWarning, stacklevel=3)


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
