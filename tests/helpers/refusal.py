"""How a Hydra app of ``src/`` refuses a user's bad input: its message alone.

An error the project raises on purpose (``attnlab.errors.UserError``) ends the app with one line
on stderr, ``<stage>: <message>``, exit status 1 and no traceback (``attnlab.console.errors``);
``HYDRA_FULL_ERROR=1`` shows the traceback instead.
"""

from __future__ import annotations

import subprocess


def refusal(result: subprocess.CompletedProcess) -> str:
    """The line a finished ``python src/<app>.py`` (output captured as text) refused with.

    Asserts exit status 1 and no traceback on stderr; returns stderr's last line (Lightning's
    and MLflow's notices may come before it).
    """
    assert result.returncode == 1, f"exit status {result.returncode}:\n{result.stderr[-3000:]}"
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]
