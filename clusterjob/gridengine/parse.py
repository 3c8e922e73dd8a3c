"""Pure parsers of Grid Engine's output: text in, frozen dataclasses out, no commands run.

Formats are Son of Grid Engine 8.1.9's: ``qsub`` (plain and ``-terse``), ``qstat -xml``
(with ``-r``: the requested resources), ``qstat -j ID``, ``qacct -j ID`` (one record per
array task), ``qhost -F`` and ``qconf -sc``. Output clusterjob cannot read raises
``ValueError`` naming what was expected; the callers turn it into their own error.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import datetime

# -- qsub ----------------------------------------------------------------------------------

_QSUB = re.compile(
    r"Your job(?P<array>-array)? (?P<id>[0-9]+)(?:\.(?P<tasks>[0-9]+-[0-9]+:[0-9]+))? "
    r'\("(?P<name>.*)"\) has been submitted'
)
_TERSE = re.compile(r"\A(?P<id>[0-9]+)(?:\.(?P<tasks>[0-9]+-[0-9]+:[0-9]+))?\Z")


@dataclass(frozen=True)
class TaskRange:
    """An array job's task ids, ``first-last:step`` as qsub and qstat print them."""

    first: int
    last: int
    step: int = 1

    @classmethod
    def parse(cls, text: str) -> TaskRange:
        """ "1-4:1" -> TaskRange(1, 4, 1); a single task id "3" -> TaskRange(3, 3, 1)."""
        m = re.fullmatch(r"([0-9]+)(?:-([0-9]+)(?::([0-9]+))?)?", text.strip())
        if m is None:
            raise ValueError(f"expected a task range such as 1-4:1, got {text!r}")
        first = int(m.group(1))
        last = int(m.group(2)) if m.group(2) else first
        return cls(first, last, int(m.group(3) or 1))

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(range(self.first, self.last + 1, self.step))

    def __str__(self) -> str:
        return f"{self.first}-{self.last}:{self.step}"


@dataclass(frozen=True)
class SubmittedJob:
    """What qsub said it created: the job id, and an array's task range."""

    job_id: str
    tasks: TaskRange | None = None
    name: str | None = None  # None from ``qsub -terse``


def parse_qsub(stdout: str) -> SubmittedJob:
    """The job qsub created, from its plain (``Your job 12 ("x") has been submitted``,
    ``Your job-array 12.1-4:1 ("x") has been submitted``) or ``-terse`` output (``12``,
    ``12.1-4:1``). Other lines (warnings) are skipped."""
    for line in stdout.splitlines():
        line = line.strip()
        m = _QSUB.search(line) or _TERSE.match(line)
        if m is None:
            continue
        tasks = TaskRange.parse(m.group("tasks")) if m.group("tasks") else None
        name = m.groupdict().get("name")
        return SubmittedJob(m.group("id"), tasks, name)
    first = stdout.strip().splitlines()[0] if stdout.strip() else "nothing"
    raise ValueError(f"expected qsub's 'Your job N (...) has been submitted', got {first!r}")


# -- job states ----------------------------------------------------------------------------

# The letters of a qstat state code (qstat(1)): d deleted, E error, h hold, r running,
# R restarted, s/S/T suspended (by the user or queue, by a subordinate queue, by a
# threshold), t transferring, w waiting, q queued.
PENDING = "PENDING"
HELD = "HELD"
RUNNING = "RUNNING"
SUSPENDED = "SUSPENDED"
DELETING = "DELETING"
ERROR = "ERROR"
_STATE_LETTERS = frozenset("dEhrRsStTwqz")


def job_state(code: str) -> str:
    """A qstat state code (``qw``, ``hqw``, ``r``, ``t``, ``Eqw``, ``dr``, ``Rr``, ``S``...)
    as one word: ERROR over DELETING over SUSPENDED over RUNNING over HELD over PENDING."""
    if not code or not set(code) <= _STATE_LETTERS:
        raise ValueError(f"expected a qstat state code such as qw or r, got {code!r}")
    if "E" in code:
        return ERROR
    if "d" in code:
        return DELETING
    if any(c in code for c in "sST"):
        return SUSPENDED
    if "r" in code or "t" in code:
        return RUNNING
    if "h" in code:
        return HELD
    return PENDING


# -- qstat -xml ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueuedJob:
    """One line of ``qstat -xml``: a job, or one task of a running array job."""

    job_id: str
    name: str
    owner: str
    state_code: str  # as qstat prints it, e.g. "hqw"
    state: str  # job_state(state_code)
    slots: int
    queue: str | None = None  # "all.q"; None while pending
    host: str | None = None  # "node1"; None while pending
    tasks: str | None = None  # a pending range "1-4:1" or a running task id "2"
    priority: float | None = None
    time: datetime | None = None  # start time when running, submission time when pending
    resources: dict[str, str] = field(default_factory=dict)  # hard requests (qstat -r)
    queue_request: str | None = None  # the requested queue (-q), with qstat -r


def _text(el: ET.Element, tag: str) -> str | None:
    found = el.find(tag)
    if found is None or found.text is None:
        return None
    return found.text.strip() or None


def _iso(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def parse_qstat_xml(xml: str) -> list[QueuedJob]:
    """Every job (and running array task) in ``qstat -xml [-r]`` output, running first as
    qstat lists them."""
    try:
        root = ET.fromstring(xml.strip())
    except ET.ParseError as exc:
        raise ValueError(f"expected qstat -xml output: {exc}") from None
    if root.tag != "job_info":
        raise ValueError(f"expected qstat -xml's <job_info>, got <{root.tag}>")
    jobs: list[QueuedJob] = []
    for el in root.iter("job_list"):
        job_id = _text(el, "JB_job_number")
        code = _text(el, "state")
        if job_id is None or code is None:
            raise ValueError("qstat -xml: a job_list without JB_job_number or state")
        queue, host = None, None
        instance = _text(el, "queue_name")
        if instance is not None:
            queue, _, rest = instance.partition("@")
            host = rest or None
        priority = _text(el, "JAT_prio")
        resources = {
            r.get("name", ""): (r.text or "").strip()
            for r in el.findall("hard_request")
            if r.get("name")
        }
        jobs.append(
            QueuedJob(
                job_id=job_id,
                name=_text(el, "JB_name") or "",
                owner=_text(el, "JB_owner") or "",
                state_code=code,
                state=job_state(code),
                slots=int(_text(el, "slots") or 1),
                queue=queue,
                host=host,
                tasks=_text(el, "tasks"),
                priority=float(priority) if priority is not None else None,
                time=_iso(_text(el, "JAT_start_time") or _text(el, "JB_submission_time")),
                resources=resources,
                queue_request=_text(el, "hard_req_queue"),
            )
        )
    return jobs


# -- qstat -j ID ---------------------------------------------------------------------------


@dataclass(frozen=True)
class JobDetail:
    """What ``qstat -j ID`` says of one job: its request, and why it waits or failed."""

    job_id: str
    name: str
    owner: str | None
    resources: dict[str, str]  # hard resource_list: {"gpu": "1", "gpu_type": "a100"}
    queues: tuple[str, ...]  # hard_queue_list
    tasks: TaskRange | None
    hold_ids: tuple[str, ...]  # jid_predecessor_list
    error_reasons: tuple[str, ...]  # "error reason N:" lines (the job is in Eqw)
    scheduling_info: tuple[str, ...]  # why the scheduler did not start it
    fields: dict[str, str]  # every "key: value" line as printed

    def shortfalls(self) -> tuple[Shortfall, ...]:
        """Each host or queue instance that could not take the job for want of a resource,
        from scheduling info lines such as ``(-l gpu=4,gpu_type=a100) cannot run at host
        "host1" because it offers only hc:gpu=0.000000``."""
        found = []
        for line in self.scheduling_info:
            m = _OFFERS_ONLY.search(line)
            if m is not None:
                found.append(Shortfall(m.group("where"), m.group("name"), float(m.group("value"))))
        return tuple(found)


@dataclass(frozen=True)
class Shortfall:
    """A host (or queue instance) that offers less of a resource than the job asks for."""

    where: str  # "host1", or a queue instance "all.q@node2"
    resource: str  # "gpu"
    offered: float  # what it has left: 0.0 when every GPU is taken


_FIELD_LINE = re.compile(r"\A(?P<key>[A-Za-z_][A-Za-z0-9_ .()-]*?):\s*(?P<value>.*)\Z")
_OFFERS_ONLY = re.compile(
    r'cannot run (?:at host|in queue) "(?P<where>[^"]+)" because it offers only '
    r"(?:[a-z]{2}:)?(?P<name>[A-Za-z0-9_]+)=(?P<value>[0-9.]+)"
)


def _resource_list(text: str) -> dict[str, str]:
    """ "gpu=1,gpu_type=a100" -> {"gpu": "1", "gpu_type": "a100"}."""
    out: dict[str, str] = {}
    for item in text.split(","):
        name, eq, value = item.strip().partition("=")
        if name:
            out[name] = value if eq else "TRUE"
    return out


def parse_qstat_j(stdout: str) -> JobDetail:
    """One job's ``qstat -j ID`` text. Continuation lines (indented, as scheduling info's
    second and later reasons) belong to the key above them."""
    fields: dict[str, str] = {}
    errors: list[str] = []
    scheduling: list[str] = []
    last: str | None = None
    for raw in stdout.splitlines():
        if not raw.strip() or raw.startswith("====="):
            continue
        if raw[:1].isspace() and last is not None:
            if last == "scheduling info":
                scheduling.append(raw.strip())
            else:
                fields[last] += "\n" + raw.strip()
            continue
        m = _FIELD_LINE.match(raw.rstrip())
        if m is None:
            continue
        key, value = m.group("key").strip(), m.group("value").strip()
        last = key
        if key.startswith("error reason"):
            errors.append(value)
        elif key == "scheduling info" and value:
            scheduling.append(value)
        fields[key] = value
    if "job_number" not in fields:
        raise ValueError("expected qstat -j output with a job_number line")
    tasks = fields.get("job-array tasks")
    queues = fields.get("hard_queue_list", "")
    holds = fields.get("jid_predecessor_list", "") or fields.get("jid_predecessor_list (req)", "")
    return JobDetail(
        job_id=fields["job_number"],
        name=fields.get("job_name", ""),
        owner=fields.get("owner"),
        resources=_resource_list(fields.get("hard resource_list", "")),
        queues=tuple(q.strip() for q in queues.split(",") if q.strip()),
        tasks=TaskRange.parse(tasks) if tasks else None,
        hold_ids=tuple(j.strip() for j in holds.split(",") if j.strip()),
        error_reasons=tuple(errors),
        scheduling_info=tuple(scheduling),
        fields=fields,
    )


# -- qacct -j ID ---------------------------------------------------------------------------


@dataclass(frozen=True)
class AccountedJob:
    """One ``qacct -j`` record: a job, or one task of an array job."""

    job_id: str
    task_id: int | None  # None outside arrays ("undefined")
    name: str
    owner: str
    queue: str
    hostname: str
    exit_status: int
    failed: int  # 0: ran; else why Grid Engine itself failed it
    failed_reason: str  # "assumedly after job" for failed 100 after a qdel
    submitted: datetime | None
    started: datetime | None
    ended: datetime | None
    wallclock_s: float | None
    maxvmem_bytes: int | None
    category: str  # the request as qacct records it: "-l gpu=1,gpu_type=a100"
    fields: dict[str, str]

    @property
    def resources(self) -> dict[str, str]:
        """The ``-l`` requests of ``category``: {"gpu": "1", "gpu_type": "a100"}."""
        found: dict[str, str] = {}
        words = self.category.split()
        for flag, value in zip(words, words[1:], strict=False):
            if flag == "-l":
                found.update(_resource_list(value))
        return found

    @property
    def succeeded(self) -> bool:
        return self.failed == 0 and self.exit_status == 0


# qacct prints ctime-like dates ("Mon Jan  1 10:00:00 2024") in 8.1.9; older releases
# "01/01/2024 10:00:00.123".
_DATE_FORMATS = ("%a %b %d %H:%M:%S %Y", "%m/%d/%Y %H:%M:%S.%f", "%m/%d/%Y %H:%M:%S")
_SIZE_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def _date(text: str | None) -> datetime | None:
    if not text or text in ("-/-", "undefined"):
        return None
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(" ".join(text.split()), fmt)
        except ValueError:
            continue
    return None


def _seconds(text: str | None) -> float | None:
    if not text:
        return None
    try:
        return float(text.removesuffix("s"))
    except ValueError:
        return None


def _bytes(text: str | None) -> int | None:
    """ "12.344M" -> bytes; qacct prints maxvmem with a binary unit letter."""
    m = re.fullmatch(r"([0-9.]+)([KMGT]?)B?", (text or "").strip())
    if m is None:
        return None
    return round(float(m.group(1)) * _SIZE_UNITS[m.group(2)])


# "0", "100 : assumedly after job", "26  : opening input/output file", "137   (Killed)"
_CODE_FIELD = re.compile(r"\A(?P<code>-?[0-9]+)\s*(?::\s*(?P<why>.*?)|\((?P<signal>.*)\))?\s*\Z")


def _int_field(fields: dict[str, str], key: str) -> tuple[int, str]:
    """A code and the words after it (``failed``'s reason, ``exit_status``'s signal)."""
    text = fields.get(key)
    if text is None:
        raise ValueError(f"qacct -j: a record without {key}")
    m = _CODE_FIELD.match(text.strip())
    if m is None:
        raise ValueError(f"qacct -j: {key} {text!r} is not a number")
    return int(m.group("code")), (m.group("why") or m.group("signal") or "").strip()


def parse_qacct(stdout: str) -> list[AccountedJob]:
    """Every record of ``qacct -j ID`` output (one per array task), in its order."""
    records: list[dict[str, str]] = []
    current: dict[str, str] | None = None
    for raw in stdout.splitlines():
        if raw.startswith("====="):
            current = {}
            records.append(current)
            continue
        if not raw.strip() or current is None:
            continue
        key, _, value = raw.strip().partition(" ")
        current[key] = value.strip()
    out: list[AccountedJob] = []
    for rec in records:
        if "jobnumber" not in rec:
            raise ValueError("qacct -j: a record without jobnumber")
        exit_status, _ = _int_field(rec, "exit_status")
        failed, reason = _int_field(rec, "failed")
        task = rec.get("taskid", "undefined")
        out.append(
            AccountedJob(
                job_id=rec["jobnumber"],
                task_id=int(task) if task.isdigit() else None,
                name=rec.get("jobname", ""),
                owner=rec.get("owner", ""),
                queue=rec.get("qname", ""),
                hostname=rec.get("hostname", ""),
                exit_status=exit_status,
                failed=failed,
                failed_reason=reason,
                submitted=_date(rec.get("qsub_time")),
                started=_date(rec.get("start_time")),
                ended=_date(rec.get("end_time")),
                wallclock_s=_seconds(rec.get("ru_wallclock")),
                maxvmem_bytes=_bytes(rec.get("maxvmem")),
                category=rec.get("category", ""),
                fields=rec,
            )
        )
    return out


# -- qhost -F ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HostRecord:
    """One execution host of ``qhost -F``: its size and its resource values."""

    name: str
    arch: str | None
    cpus: int | None
    resources: dict[str, str]  # "gpu": "4.000000", "gpu_type": "a100" (prefix dropped)
    sources: dict[str, str]  # resource -> qhost's two-letter source, e.g. "hc" (consumable)

    @property
    def gpus(self) -> int | None:
        """The host's ``gpu`` consumable as qhost shows it (what is free now)."""
        value = self.resources.get("gpu")
        return None if value is None else int(float(value))

    @property
    def gpu_type(self) -> str | None:
        return self.resources.get("gpu_type")


# A resource line under its host: the first after "Host Resource(s):" on the same line (8.1.9).
_RESOURCE_LINE = re.compile(
    r"\A\s+(?:Host Resource\(s\):\s*)?(?P<src>[a-z]{2}):(?P<name>[A-Za-z0-9_.-]+)=(?P<value>.*)\Z"
)


def parse_qhost(stdout: str) -> list[HostRecord]:
    """The hosts of ``qhost -F [names]``; the ``global`` pseudo host is left out."""
    hosts: list[HostRecord] = []
    current: HostRecord | None = None
    for raw in stdout.splitlines():
        if not raw.strip() or raw.startswith(("HOSTNAME", "---")):
            continue
        m = _RESOURCE_LINE.match(raw.rstrip())
        if m is not None:
            if current is not None:
                current.resources[m.group("name")] = m.group("value").strip()
                current.sources[m.group("name")] = m.group("src")
            continue
        words = raw.split()
        if raw[:1].isspace() or not words:
            continue
        if words[0] == "global":
            current = None
            continue
        arch = words[1] if len(words) > 1 and words[1] != "-" else None
        cpus = int(words[2]) if len(words) > 2 and words[2].isdigit() else None
        current = HostRecord(words[0], arch, cpus, {}, {})
        hosts.append(current)
    return hosts


# -- qconf -sc -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ComplexAttribute:
    """One line of ``qconf -sc``: a resource jobs may request with ``-l``."""

    name: str
    shortcut: str
    type: str  # INT, STRING, RESTRING, BOOL, MEMORY, TIME, ...
    relop: str
    requestable: str  # YES, NO, FORCED
    consumable: str  # YES, NO, JOB
    default: str
    urgency: str

    @property
    def is_consumable(self) -> bool:
        return self.consumable in ("YES", "JOB")


def parse_qconf_sc(stdout: str) -> dict[str, ComplexAttribute]:
    """The complex attributes of ``qconf -sc``, by name; comment lines skipped."""
    found: dict[str, ComplexAttribute] = {}
    for raw in stdout.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        words = line.split()
        if len(words) < 8:
            raise ValueError(f"qconf -sc: expected 8 columns, got {line!r}")
        found[words[0]] = ComplexAttribute(*words[:8])
    return found
