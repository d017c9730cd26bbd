"""``python -m app.cli`` runs the same command line as the ``quorra`` script."""

from __future__ import annotations

import subprocess
import sys


def test_python_dash_m_app_cli_runs_the_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "usage: quorra bench NAME" in done.stdout
