"""The clusterjob commands a message tells a person to type next.

A command typed as printed must reach the same cluster: for a job submitted over ssh it
carries ``--host`` (the host as it was given, or its profile's name).
"""

from __future__ import annotations

import shlex


def follow_up(*words: str, host: str = "") -> str:
    """``clusterjob [--host HOST] WORDS...``, each word quoted for the shell."""
    where = ["--host", host] if host else []
    return shlex.join(["clusterjob", *where, *words])
