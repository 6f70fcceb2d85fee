"""Errors a user can act on.

Every failure caused by the user's input (missing data, impossible privacy parameters, a run directory
that does not exist, ...) raises a subclass of :class:`PrivdistillError` whose message says what was
wrong, where we looked and what to do. The CLI prints that message without a traceback.
"""


class PrivdistillError(Exception):
    """Base class: the message is written for the user and is printed as is."""


class DataError(PrivdistillError):
    """A dataset is missing, corrupt or malformed."""


class ConfigError(PrivdistillError):
    """A configuration value is invalid or impossible."""


class ModelError(PrivdistillError):
    """An unknown model name, or a model that does not fit the data."""


class PrivacyError(PrivdistillError):
    """Invalid privacy parameters (epsilon <= 0, delta outside (0, 1), ...)."""


class BudgetExceededError(PrivacyError):
    """Running further would spend more privacy budget than --max-epsilon allows."""


class RunError(PrivdistillError):
    """A run directory is missing, incomplete or inconsistent (e.g. resuming with another config)."""
