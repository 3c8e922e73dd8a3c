"""Commands: jobs (registered on the app in clusterjob.cli)."""

from __future__ import annotations
