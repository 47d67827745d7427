"""Exceptions that the command line turns into one clear message (no traceback).

Every user-facing failure (bad input file, impossible configuration, deadlocked
simulation) raises a subclass of :class:`NpusimError`; anything else escaping the
CLI is a bug in npusim.
"""


class NpusimError(Exception):
    """Base of all errors that are the user's input or configuration, not a bug."""


class ConfigError(NpusimError):
    """An input file or argument is invalid: says which file, which key/line, what was expected."""


class DeadlockError(NpusimError):
    """The simulation has tasks left that can never start; the message names them."""
