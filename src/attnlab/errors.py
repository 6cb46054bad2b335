"""The errors attnlab raises on purpose: a person's input, config or files cannot work.

:class:`UserError` marks them. Its message says what was wrong and what to do, so the Hydra
apps in ``src/`` print it alone, without a traceback (:mod:`attnlab.console.errors`); any other
exception is a bug and keeps its traceback. The project's own error classes inherit from it
and from the built-in class their callers catch (``ValueError``, ``FileNotFoundError``,
``OSError``, ...), so an ``except ValueError`` still catches a :class:`ConfigError`.
"""

from __future__ import annotations


class UserError(Exception):
    """Raised on purpose: what a person gave (a setting, a command line, a file, the machine)
    cannot work. The message names it and the fix, and is all a user needs to see."""


class ConfigError(UserError, ValueError):
    """A setting (a config key or a command-line override) that cannot work; the message names
    the key and a value that does."""


class MissingFileError(UserError, FileNotFoundError):
    """A file a stage reads does not exist; the message names it and the command that writes it."""


class DamagedFileError(UserError, ValueError):
    """A file a stage reads back is damaged (truncated, overwritten, not what its name says); the
    message names it and the command that writes it again."""


def brief(error: BaseException) -> str:
    """``"<type>: <first line of its message>"``: a library's error quoted inside one of ours,
    which stays one line (SQLAlchemy's, say, go on with the SQL and its parameters)."""
    lines = [line for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0].strip()}" if lines else type(error).__name__
