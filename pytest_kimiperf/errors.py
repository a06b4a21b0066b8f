"""Errors the plugin reports as one clear message instead of a traceback."""

from __future__ import annotations


class KimiperfError(Exception):
    """Base class: the message alone tells the user what happened and what to do."""


class ConfigError(KimiperfError):
    """Bad configuration (option, ini, pyproject table): the plugin raises it as a usage error."""


class HardwareMissingError(KimiperfError):
    """The host lacks the hardware a deployment needs; raised before anything boots."""


class ServerError(KimiperfError):
    """The server could not be started, did not become ready, or died."""


class BaselineError(KimiperfError):
    """A baseline file is corrupt, of a newer schema, or cannot be written."""
