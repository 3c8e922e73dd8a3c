"""NVIDIA Xid errors: what each one means, who is usually to blame, and whether the node must
be drained; and the kernel log's ``NVRM: Xid`` lines read back for a job's GPUs.

The table is data (``XIDS``): the Epilog reads it, and the documentation's Xid reference is
generated from it. Sources: NVIDIA's "Xid Errors" and "GPU Debug Guidelines" documents. The
``cause`` is where NVIDIA points first: ``hardware`` (the GPU, its memory, its links or its
firmware), ``driver`` or ``application`` (most often the job's own code). ``drain`` marks an
Xid after which the GPU needs a reset or a field check before another job may use it.

Stdlib only: the Epilog imports this after every job on every node.
"""

from __future__ import annotations

import os
import re

from clusterjob.record import Record

__all__ = [
    "XIDS",
    "KernelXid",
    "Xid",
    "describe",
    "parse_kernel_log",
    "read_kernel_log",
]


class Xid(Record):
    """One Xid code as NVIDIA documents it."""

    __slots__ = ("code", "meaning", "cause", "drain")

    code: int
    meaning: str  # short, for a drain reason: "GPU fell off the bus"
    cause: str  # "hardware", "driver" or "application"
    drain: bool  # the GPU needs a reset or a field check before the next job

    def __init__(self, code: int, meaning: str, cause: str, drain: bool) -> None:
        self._fill(code, meaning, cause, drain)


XIDS: dict[int, Xid] = {
    x.code: x
    for x in (
        Xid(8, "GPU stopped processing (timeout)", "driver", False),
        Xid(
            13,
            "graphics engine exception (often an out-of-range access in the program)",
            "application",
            False,
        ),
        Xid(
            31,
            "GPU memory page fault (often an illegal address in the program)",
            "application",
            False,
        ),
        Xid(32, "invalid or corrupted push buffer stream (PCIe or driver)", "driver", False),
        Xid(38, "driver firmware error", "driver", True),
        Xid(43, "GPU stopped processing (the program's context was reset)", "application", False),
        Xid(45, "preemptive cleanup after an earlier error", "application", False),
        Xid(48, "double-bit ECC error", "hardware", True),
        Xid(61, "internal micro-controller breakpoint/warning", "hardware", True),
        Xid(62, "internal micro-controller halt", "hardware", True),
        Xid(
            63, "ECC page retirement or row remapping recorded (reset to apply)", "hardware", False
        ),
        Xid(64, "ECC page retirement or row remapping failed", "hardware", True),
        Xid(68, "video decoder (NVDEC) exception", "application", False),
        Xid(69, "graphics engine class error", "application", False),
        Xid(74, "NVLink error", "hardware", True),
        Xid(79, "GPU fell off the bus", "hardware", True),
        Xid(92, "high single-bit ECC error rate", "hardware", False),
        Xid(
            94,
            "contained ECC error (only the program that used the memory was hit)",
            "hardware",
            False,
        ),
        Xid(95, "uncontained ECC error", "hardware", True),
        Xid(119, "GSP firmware RPC timeout", "hardware", True),
        Xid(120, "GSP firmware error", "hardware", True),
        Xid(121, "C2C link corrected error", "hardware", False),
        Xid(140, "unrecovered ECC error", "hardware", True),
        Xid(154, "GPU recovery action needed (reset or reboot)", "hardware", True),
    )
}


def describe(code: int) -> Xid:
    """The table's entry, or an unknown Xid (not drained: look it up, then add it here)."""
    return XIDS.get(code) or Xid(code, "not in clusterjob's Xid table", "unknown", False)


class KernelXid(Record):
    """One ``NVRM: Xid`` line of the kernel log."""

    __slots__ = ("bus_id", "code", "uptime_s", "text")

    bus_id: str  # normalised dddd:bb:dd.0 (the kernel writes no function number)
    code: int
    uptime_s: float | None  # seconds since boot, when the line carries a timestamp
    text: str  # the line's message, as logged (for the record)

    def __init__(self, bus_id: str, code: int, uptime_s: float | None, text: str) -> None:
        self._fill(bus_id, code, uptime_s, text)


# "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., GPU has fallen off the bus."
_XID_LINE = re.compile(
    r"NVRM: Xid \(PCI:(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-F]{2}):"
    r"(?P<dev>[0-9a-fA-F]{2})(?:\.(?P<fn>[0-7]))?\): (?P<code>\d{1,5})\b"
)
_DMESG_TIME = re.compile(r"^\[\s*(\d+\.\d+)\]\s*")  # dmesg: "[ 1234.567890] ..."
_KMSG_HEAD = re.compile(r"^(\d+),\d+,(\d+),[^;]*;")  # /dev/kmsg: "4,512,1234567890,-;..."


def parse_kernel_log(text: str, since_uptime: float | None = None) -> list[KernelXid]:
    """The Xid lines of a kernel log (``dmesg`` or ``/dev/kmsg`` form), in order.

    ``since_uptime``: only lines stamped at or after that many seconds since boot (a line
    without a timestamp is kept: a test's file, or ``dmesg -t``).
    """
    found = []
    for line in text.splitlines():
        stamp: float | None = None
        start = 0
        if t := _DMESG_TIME.match(line):
            stamp, start = float(t[1]), t.end()
        elif k := _KMSG_HEAD.match(line):
            if int(k[1]) >= 8:  # facility not the kernel's: a process wrote it to /dev/kmsg
                continue
            stamp, start = int(k[2]) / 1e6, k.end()
        m = _XID_LINE.match(line, start)  # the driver's own line starts with "NVRM: Xid"
        if not m:
            continue
        if since_uptime is not None and stamp is not None and stamp < since_uptime:
            continue
        domain = int(m["domain"] or "0", 16) & 0xFFFF
        bus_id = f"{domain:04x}:{m['bus'].lower()}:{m['dev'].lower()}.{m['fn'] or '0'}"
        message = line[m.start() :].strip()[:300]
        found.append(KernelXid(bus_id, int(m["code"]), stamp, message))
    return found


MAX_KERNEL_LOG = 4 * 1024 * 1024  # bytes read at most: the ring buffer is far smaller


def read_kernel_log(path: str | None) -> tuple[str, str]:
    """The kernel log's text and where it came from, or ``("", why not)``; never raises.

    ``path``: a file (tests, or a site that keeps the kernel log elsewhere). Default:
    ``/dev/kmsg`` read without blocking (root; every record still in the ring buffer).
    """
    if path:
        try:
            with open(path, "rb") as f:
                return f.read(MAX_KERNEL_LOG).decode("utf-8", "replace"), path
        except OSError as exc:
            return "", f"not read: {path}: {exc.strerror or exc}"
    try:
        fd = os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        return "", f"not read: /dev/kmsg: {exc.strerror or exc}"
    chunks: list[bytes] = []
    size = 0
    try:
        while size < MAX_KERNEL_LOG:
            try:
                record = os.read(fd, 8192)  # one record per read
            except BlockingIOError:
                break  # the end of the buffer
            except OSError as exc:
                if exc.errno == 32:  # EPIPE: a record was overwritten under us; go on
                    continue
                return "", f"not read: /dev/kmsg: {exc.strerror or exc}"
            if not record:
                break
            chunks.append(record)
            size += len(record)
    finally:
        os.close(fd)
    return b"".join(chunks).decode("utf-8", "replace"), "/dev/kmsg"


def boot_uptime_at(epoch: float) -> float | None:
    """Seconds since boot at wall-clock time ``epoch`` (for the kernel log's stamps)."""
    try:
        with open("/proc/uptime", encoding="ascii") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    import time

    return uptime - (time.time() - epoch)
