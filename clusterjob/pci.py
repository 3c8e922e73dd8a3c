"""PCI bus IDs: NVML writes ``00000000:3B:00.0``, sysfs ``0000:3b:00.0``; both name one slot."""

from __future__ import annotations

import re

_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)


def normalise_bus_id(text: str) -> str:
    """Canonical form ``dddd:bb:dd.f`` in lower case (domain truncated to 16 bits, as sysfs).

    Raises ValueError for anything that is not a PCI address.
    """
    m = _BUS_ID.match(text.strip())
    if not m:
        raise ValueError(f"not a PCI bus ID: {text!r} (expected e.g. 0000:3b:00.0)")
    domain = int(m["domain"] or "0", 16)
    if domain > 0xFFFF:
        raise ValueError(f"PCI domain out of range in {text!r}")
    return f"{domain:04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn']}"
