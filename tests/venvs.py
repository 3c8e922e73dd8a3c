"""A venv of a test's own that still sees the environment running the tests.

Made without pip (pip runs from the outer environment, ``pip --python``), its own
site-packages first, then the outer environment's through a .pth file: what the test
installs into it (a wheel, a dependency's oldest release) is what it imports, and the rest
(test tools, the other dependencies) comes from outside, with no network. `venv
--system-site-packages` would give the *base* interpreter's packages instead, which on a
fresh machine have none of them when the tests run from a venv (as .ci/run does).
"""

from __future__ import annotations

import site
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path


def venv_seeing_outside(
    path: Path, first: tuple[str, ...] = (), env: Mapping[str, str] | None = None
) -> Path:
    """Make the venv at ``path`` and return its python; ``first``: entries of the outer path
    put before the outer environment's site-packages (a checkout, to import it from there)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)],
                   env=env, capture_output=True, check=True)  # fmt: skip
    python = path / "bin" / "python"
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    outer = (*first, *site.getsitepackages())
    Path(own, "outer-environment.pth").write_text("".join(f"{p}\n" for p in outer))
    return python
