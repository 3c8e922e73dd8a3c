"""A local Grid Engine cluster (Son of Grid Engine 8.1.9, Debian 12's) with stand-in GPUs.

`clusterjob sandbox up --scheduler gridengine` builds (once, cached, as the Slurm release
roots are: ``releases.build_root``) a Debian bookworm root with gridengine-master, -exec and
-client, and runs one qmaster and three execution hosts in it, inside namespaces of their own
(mount, UTS, IPC, PID, network: ``unshare``): Grid Engine's fixed ports then clash with
nothing, and ``down`` ends all of it by ending the namespace's first process.

Grid Engine has no ``slurmd -N``: a host is named by the address its connections come from.
So each execution host has its own loopback address and name in the namespace's /etc/hosts
(``127.0.0.2 host1``), its own execd port, its own host name (a UTS namespace of its own),
and connects from its own address: ``gridengine_source_address.c``, compiled at ``up`` with
the system's cc, is in the namespace's /etc/ld.so.preload and binds to the address execd's
environment names (its jobs and prologs inherit it, so they can run qstat and qsub too).
GPUs are a consumable complex ``gpu`` and a string complex ``gpu_type`` (8.1.9 has no RSMAP,
so no device ids); each execd's environment also points the stand-in NVML library (bound in
at the system's library path) at that host's scenario. The queue's prolog and epilog are
clusterjob's GPU binding hooks (``bind-gpus``, ``release-gpus``), run by the root's python3
with a copy of clusterjob made at every up and a site file for these hosts: they give each
job its own GPUs on the host, as a site with Grid Engine would install them. ``qmaster``
stops ~9 s after ``qconf -km``: ``down`` waits for it, so the spool is closed cleanly.

Everything that changes lives in the state directory (``DEFAULT_STATE_DIR``): the qmaster's
spool and the cell's common folder (accounting) are bound over the root's, so the cached root
stays as built. ``bin/`` there holds small scripts (qsub, qstat, qacct, ...) that run the
command inside the namespace (``nsenter``), in the caller's directory when it is seen inside:
/tmp and the state directory (``jobs/`` for job scripts and outputs) are the same on both
sides.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.sandbox import host, releases

Say = Callable[[str], None]

DEFAULT_STATE_DIR = Path("/var/lib/clusterjob-sandbox-gridengine")
SUITE = "bookworm"
ROOT_NAME = "gridengine-bookworm"
ROOT_PACKAGES = (
    "gridengine-master",
    "gridengine-exec",
    "gridengine-client",
    "procps",
    "iproute2",
    "python3",
)
SGE_ROOT = "/var/lib/gridengine"
SGE_CELL = "default"
SPOOL = "/var/spool/gridengine"
MASTER = "master"
QMASTER_PORT = 6444
QUEUE = "all.q"
HOSTGROUP = "@allhosts"
PATH_INSIDE = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# The stand-in NVML library is bound over this file (made empty in the root at the first up).
NVML_INSIDE = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
SOURCE_ADDRESS_ENV = envvars.GE_SOURCE_ADDRESS
PRELOAD_SOURCE = Path(__file__).with_name("gridengine_source_address.c")
# The commands bin/ offers on the host side.
CLIENT_COMMANDS = (
    "qsub",
    "qstat",
    "qacct",
    "qdel",
    "qhost",
    "qconf",
    "qalter",
    "qhold",
    "qrls",
    "qmod",
    "qselect",
)


def _quiet(_: str) -> None:
    pass


# --- the cluster's shape (pure) ----------------------------------------------------------------


@dataclass(frozen=True)
class GridEngineHost:
    """One execution host: its name, loopback address, execd port and stand-in GPUs."""

    name: str
    address: str
    execd_port: int
    gpus: int
    gpu_type: str  # the `gpu_type` complex's value and the stand-in model: a100, v100, h100


# host3's GPUs are another model: a job asking for a100 must never land there.
HOSTS: tuple[GridEngineHost, ...] = (
    GridEngineHost("host1", "127.0.0.2", 6451, 4, "a100"),
    GridEngineHost("host2", "127.0.0.3", 6452, 4, "a100"),
    GridEngineHost("host3", "127.0.0.4", 6453, 2, "v100"),
)
SLOTS_PER_HOST = 8


def hosts_file(hosts: Sequence[GridEngineHost] = HOSTS) -> str:
    """/etc/hosts inside: the master's name on the address clients connect from (127.0.0.1,
    before qmaster starts: it caches lookups), each execution host on its own address."""
    lines = [f"127.0.0.1 {MASTER} localhost"]
    lines += [f"{h.address} {h.name}" for h in hosts]
    return "\n".join(lines) + "\n"


def edit_config(text: str, changes: Mapping[str, str]) -> str:
    """A Grid Engine configuration (``qconf -sconf``/``-ssconf`` output: ``key value`` lines)
    with ``changes`` applied; keys it lacks are appended. Comment lines are dropped (qconf
    reads them back as keys)."""
    out: list[str] = []
    seen: set[str] = set()
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key = line.split(None, 1)[0]
        if key in changes:
            out.append(f"{key:<32} {changes[key]}")
            seen.add(key)
        else:
            out.append(line)
    out += [f"{key:<32} {value}" for key, value in changes.items() if key not in seen]
    return "\n".join(out) + "\n"


GLOBAL_CHANGES = {
    # root submits the tests' jobs; execd reads these only when it starts
    "min_uid": "0",
    "min_gid": "0",
    "load_report_time": "00:00:05",
    "max_unheard": "00:00:30",
    # accounting written at once (qacct still lags a few seconds behind a job's end)
    "reporting_params": "accounting=true reporting=false flush_time=00:00:01 joblog=false "
    "sharelog=00:00:00",
}
SCHEDULER_CHANGES = {
    "schedule_interval": "0:0:1",
    "flush_submit_sec": "1",
    "flush_finish_sec": "1",
    "job_load_adjustments": "NONE",
    "load_adjustment_decay_time": "0:0:0",
}

# name shortcut type relop requestable consumable default urgency
GPU_COMPLEXES = (
    "gpu                 gpu        INT         <=    YES         YES        0        0",
    "gpu_type            gpu_type   STRING      ==    YES         NO         NONE     0",
)


def complexes(text: str) -> str:
    """``qconf -sc`` output with the GPU complexes (``GPU_COMPLEXES``) in, once."""
    ours = {line.split()[0] for line in GPU_COMPLEXES}
    kept = [
        line
        for line in text.splitlines()
        if line.strip() and not line.startswith("#") and line.split()[0] not in ours
    ]
    return "\n".join([*kept, *GPU_COMPLEXES]) + "\n"


def exechost_config(h: GridEngineHost) -> str:
    """``qconf -Ae``/``-Me`` input for one execution host: its GPUs as complex values."""
    return "\n".join(
        [
            f"hostname              {h.name}",
            "load_scaling          NONE",
            f"complex_values        gpu={h.gpus},gpu_type={h.gpu_type}",
            "user_lists            NONE",
            "xuser_lists           NONE",
            "projects              NONE",
            "xprojects             NONE",
            "usage_scaling         NONE",
            "report_variables      NONE",
            "",
        ]
    )


def hostgroup_config(hosts: Sequence[GridEngineHost] = HOSTS) -> str:
    return f"group_name {HOSTGROUP}\nhostlist {' '.join(h.name for h in hosts)}\n"


def queue_config(slots: int = SLOTS_PER_HOST, prolog: str = "NONE", epilog: str = "NONE") -> str:
    """``qconf -Aq``/``-Mq`` input for the one queue: every host, no load thresholds (a
    loaded 2-core machine would otherwise put it in alarm state); ``prolog``/``epilog`` as
    Grid Engine writes them (``root@/path``)."""
    values = {
        "qname": QUEUE,
        "hostlist": HOSTGROUP,
        "seq_no": "0",
        "load_thresholds": "NONE",
        "suspend_thresholds": "NONE",
        "nsuspend": "1",
        "suspend_interval": "00:05:00",
        "priority": "0",
        "min_cpu_interval": "00:05:00",
        "processors": "UNDEFINED",
        "qtype": "BATCH INTERACTIVE",
        "ckpt_list": "NONE",
        "pe_list": "NONE",
        "rerun": "FALSE",
        "slots": str(slots),
        "tmpdir": "/tmp",
        "shell": "/bin/sh",
        "prolog": prolog,
        "epilog": epilog,
        "shell_start_mode": "unix_behavior",
        "starter_method": "NONE",
        "suspend_method": "NONE",
        "resume_method": "NONE",
        "terminate_method": "NONE",
        "notify": "00:00:60",
        "owner_list": "NONE",
        "user_lists": "NONE",
        "xuser_lists": "NONE",
        "subordinate_list": "NONE",
        "complex_values": "NONE",
        "projects": "NONE",
        "xprojects": "NONE",
        "calendar": "NONE",
        "initial_state": "default",
    }
    for limit in ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem"):
        values[f"s_{limit}"] = "INFINITY"
        values[f"h_{limit}"] = "INFINITY"
    return "".join(f"{key:<20} {value}\n" for key, value in values.items())


# The stand-ins' NVML names, by gpu_type value (clusterjob.sandbox.standin).
NVML_NAMES = {
    "a100": "NVIDIA A100-SXM4-80GB",
    "v100": "Tesla V100-SXM2-32GB",
    "h100": "NVIDIA H100 80GB HBM3",
}
# The GPU binding hooks run with the root's own python3 and a copy of clusterjob and of what
# its node path imports (made at every up): Grid Engine names no GPUs, `bind-gpus` does.
NODE_PYTHON = "/usr/bin/python3"
NODE_PYTHON_VERSION = (3, 11)  # bookworm's: the copied compiled modules must match it
NODE_MODULES = (
    "ruamel",
    "hostlist.py",
    "pynvml.py",
    "_ruamel_yaml.cpython-311-x86_64-linux-gnu.so",
)


def bus_ids(h: GridEngineHost) -> list[str]:
    """The stand-in GPUs' PCI bus IDs on ``h``, in order."""
    return [f"0000:{0x10 + 0x10 * i:02x}:00.0" for i in range(h.gpus)]


def sandbox_site(hosts: Sequence[GridEngineHost] = HOSTS) -> str:
    """A site config for this cluster (what the hooks check against): one model per
    ``gpu_type`` value, every host in the node map at its stand-ins' bus IDs."""
    types = sorted({h.gpu_type for h in hosts})
    lines = ["site: gridengine-sandbox", "scheduler: gridengine", "models:"]
    lines += [
        f'  {t.upper()}: {{aliases: [{t}], gres_type: {t}, nvml_names: ["{NVML_NAMES[t]}"]}}'
        for t in types
    ]
    lines += [
        "partitions:",
        f'  {QUEUE}: {{nodes: "{",".join(h.name for h in hosts)}", default: true}}',
    ]
    lines.append("node_map:")
    for h in hosts:
        lines += [f"  - nodes: {h.name}", "    gpus:"]
        lines += [f'      - {{model: {h.gpu_type.upper()}, bus_id: "{b}"}}' for b in bus_ids(h)]
    return "\n".join(lines) + "\n"


def hook_script(command: str, layout: Layout) -> str:
    """The queue's prolog (``bind-gpus``) or epilog (``release-gpus``)."""
    lib, site = shlex.quote(str(layout.node_lib)), shlex.quote(str(layout.site_file))
    return f"#!/bin/sh\nPYTHONPATH={lib} exec {NODE_PYTHON} -m clusterjob {command} --site {site}\n"


def execd_env(h: GridEngineHost, layout: Layout) -> dict[str, str]:
    """The environment one execd starts with; its jobs inherit it (execd_params INHERIT_ENV
    is true by default, but Grid Engine drops LD_PRELOAD and LD_LIBRARY_PATH from it): the
    address the preload binds to (every process inside loads it: /etc/ld.so.preload) and
    which stand-in GPUs that host's NVML reports (the library is bound in at ``NVML_INSIDE``)."""
    return {
        **base_env(),
        "SGE_EXECD_PORT": str(h.execd_port),
        "SGE_EXECD_PIDFILE": f"/run/gridengine/execd-{h.name}.pid",
        SOURCE_ADDRESS_ENV: h.address,
        envvars.NVML_SCENARIO: str(layout.scenario(h.name)),
    }


def base_env() -> dict[str, str]:
    """What every Grid Engine command inside needs (the Debian packages' defaults, said)."""
    return {
        "PATH": PATH_INSIDE,
        "SGE_ROOT": SGE_ROOT,
        "SGE_CELL": SGE_CELL,
        "SGE_QMASTER_PORT": str(QMASTER_PORT),
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "LANG": "C.UTF-8",
    }


def wrapper_script(command: str, layout: Layout) -> str:
    """bin/COMMAND: run Grid Engine's COMMAND inside the sandbox's namespaces and root, in the
    caller's directory (which must be seen inside: /tmp or the state directory), with the
    caller's environment (``qsub -V``) and Grid Engine's variables; its exit status."""
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in base_env().items() if k not in _KEEP)
    holder = shlex.quote(str(layout.holder_pid))
    up = "clusterjob sandbox up --scheduler gridengine"
    seen = f"seen inside are /tmp and {layout.state_dir}"
    return f"""#!/bin/sh
# Grid Engine's {command}, run in the clusterjob Grid Engine sandbox ({layout.state_dir}).
pid=$(cat {holder} 2>/dev/null) && [ -d "/proc/$pid" ] || {{
    echo "{command}: the Grid Engine sandbox is not up ({up})" >&2
    exit 2
}}
exec nsenter -t "$pid" -m -u -i -n -p -r -w -- env {env} /bin/sh -c '
    cd "$0" 2>/dev/null || {{
        echo "{command}: $0 is not seen inside the Grid Engine sandbox ({seen})" >&2
        exit 2
    }}
    exec "$@"' "$PWD" {command} "$@"
"""


_KEEP = frozenset({"HOME", "USER", "LOGNAME", "LANG"})  # the caller's own, where it has them


# --- where things live ------------------------------------------------------------------------


@dataclass(frozen=True)
class Layout:
    """Every file of one Grid Engine sandbox, under its state directory."""

    state_dir: Path

    @property
    def root(self) -> Path:
        return releases.roots_dir() / "roots" / ROOT_NAME

    def inside(self, path: str | Path) -> Path:
        return self.root / Path(path).relative_to("/")

    @property
    def spool(self) -> Path:
        return self.state_dir / "spool"

    @property
    def common(self) -> Path:
        return self.state_dir / "common"

    @property
    def jobs(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def lib_dir(self) -> Path:
        return self.state_dir / "lib"

    @property
    def preload(self) -> Path:
        return self.lib_dir / "gridengine_source_address.so"

    @property
    def ld_so_preload(self) -> Path:
        return self.state_dir / "ld.so.preload"

    def scenario(self, host_name: str) -> Path:
        return self.state_dir / "nvml" / f"{host_name}.scenario"

    @property
    def hosts(self) -> Path:
        return self.state_dir / "etc-hosts"

    @property
    def bin_dir(self) -> Path:
        return self.state_dir / "bin"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def holder_pid(self) -> Path:
        """The host pid of the namespace's first process (pid 1 inside)."""
        return self.state_dir / "namespace.pid"

    @property
    def pid_dir(self) -> Path:
        return self.state_dir / "pids"

    @property
    def node_lib(self) -> Path:
        """clusterjob as the hosts run it (``PYTHONPATH`` of the hooks and of jobs)."""
        return self.state_dir / "node-lib"

    @property
    def site_file(self) -> Path:
        return self.state_dir / "site.yaml"

    def hook(self, name: str) -> Path:
        return self.state_dir / "hooks" / name


def layout(state_dir: Path | None) -> Layout:
    return Layout((state_dir or DEFAULT_STATE_DIR).absolute())


# --- the root -------------------------------------------------------------------------------


# The packages set the cell up at install (their debconf defaults say so); that needs the
# build machine's name to resolve inside the root. The sandbox binds its own /etc/hosts over it.
ROOT_HOOKS = ('printf "127.0.0.1 localhost %s\\n" "$(hostname)" >"$1/etc/hosts"',)


def ensure_root(lay: Layout, say: Say = _quiet) -> bool:
    """The Debian root with Grid Engine, built once."""
    return releases.build_root(
        lay.root, SUITE, ROOT_PACKAGES, what="Grid Engine", essential_hooks=ROOT_HOOKS, say=say
    )


# --- the namespace ------------------------------------------------------------------------------


def holder_pid(lay: Layout) -> int | None:
    """The host pid of the namespace's pid 1 when it runs in our root, else None."""
    try:
        pid = int(lay.holder_pid.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        if os.readlink(f"/proc/{pid}/root") != str(lay.root):
            return None
    except OSError:
        return None
    return pid


def holder_script(lay: Layout) -> str:
    """What runs first in the new namespaces: the mounts (private to them), the master's host
    name, loopback up, then pid 1 in the root: a shell that reaps orphans."""
    root = shlex.quote(str(lay.root))
    state = shlex.quote(str(lay.state_dir))

    def q(p: str | Path) -> str:
        return shlex.quote(str(p))

    binds = [
        (lay.spool, lay.inside(SPOOL)),
        (lay.common, lay.inside(f"{SGE_ROOT}/{SGE_CELL}/common")),
        (lay.hosts, lay.inside("/etc/hosts")),
        (Path("/tmp"), lay.inside("/tmp")),
        (lay.state_dir, lay.inside(lay.state_dir)),
        # where every process inside finds it: jobs do not inherit execd's LD_LIBRARY_PATH
        (lay.lib_dir / "libnvidia-ml.so.1", lay.inside(NVML_INSIDE)),
        # every process inside loads the preload; it acts where execd's environment (so its
        # jobs' and prologs') names a source address: qsub and qstat from a job work too
        (lay.ld_so_preload, lay.inside("/etc/ld.so.preload")),
    ]
    lines = [
        "set -e",
        f"hostname {MASTER}",
        "ip link set lo up",
        f"mount -t proc proc {root}/proc",
        f"mount --rbind /dev {root}/dev",
        f"mount -t tmpfs -o mode=755 tmpfs {root}/run",
        f"mkdir -p {root}/run/gridengine",
        f"touch {q(lay.inside(NVML_INSIDE))} {q(lay.inside('/etc/ld.so.preload'))}",
        # each mount point made once the binds before it are in place: a state dir under
        # /tmp is then the host's own folder, not a new one in the cached root
        *(
            f"[ -e {q(dst)} ] || mkdir -p {q(dst)}\nmount --bind {q(src)} {q(dst)}"
            for src, dst in binds
        ),
        f"echo ready > {state}/namespace.ready",
        f"exec chroot {root} /bin/bash -c "
        + shlex.quote('trap "exit 0" TERM; while :; do sleep 3600 & wait $!; done'),
    ]
    return "\n".join(lines) + "\n"


def _start_holder(lay: Layout) -> int:
    ready = lay.state_dir / "namespace.ready"
    ready.unlink(missing_ok=True)
    lay.logs.mkdir(parents=True, exist_ok=True)
    lay.pid_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        "unshare",
        "--mount",
        "--uts",
        "--ipc",
        "--pid",
        "--net",
        "--fork",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        holder_script(lay),
    ]
    record = host.spawn(
        "unshare", cmd, pid_dir=lay.pid_dir, log=lay.logs / "namespace.log", env=_host_env()
    )
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        child = _child_in_root(record.pid, lay.root)
        if child is not None and ready.exists():
            lay.holder_pid.write_text(f"{child}\n")
            return child
        if not record.alive():
            break
        time.sleep(0.05)
    log = lay.logs / "namespace.log"
    raise ClusterjobError(
        f"the Grid Engine sandbox's namespace did not start: {host.last_error_line(log)}"
    )


def _host_env() -> dict[str, str]:
    return {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}


def _child_in_root(parent: int, root: Path) -> int | None:
    try:
        children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    except OSError:
        return None
    for child in children:
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{child}/root") == str(root):
                return int(child)
    return None


def _nsenter(pid: int, argv: Sequence[str], *, uts_name: str | None = None) -> list[str]:
    """``argv`` in the namespaces and root of ``pid``; ``uts_name``: in a UTS namespace of
    its own with that host name (an execution host)."""
    cmd = ["nsenter", "-t", str(pid), "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--"]
    if uts_name is None:
        return [*cmd, *argv]
    script = f'hostname {shlex.quote(uts_name)} && cd / && exec "$@"'
    return [*cmd, "unshare", "--uts", "--", "/bin/sh", "-c", script, "sh", *argv]


def run_inside(
    lay: Layout,
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """A command inside (as root, in /), to completion."""
    pid = holder_pid(lay)
    if pid is None:
        raise ClusterjobError(f"the Grid Engine sandbox in {lay.state_dir} is not up")
    return host.run(
        _nsenter(pid, ["/usr/bin/env", "-i", *_env_args(env or base_env()), *argv]),
        input=input,
        check=check,
        timeout=timeout,
    )


def _env_args(env: Mapping[str, str]) -> list[str]:
    return [f"{k}={v}" for k, v in env.items()]


def qconf(lay: Layout, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return run_inside(lay, ["qconf", *args], check=check)


def _qconf_file(lay: Layout, option: str, name: str, text: str) -> None:
    """``qconf OPTION FILE`` with ``text`` in a file called ``name`` (``-Mconf`` wants the
    file named after the configuration it replaces)."""
    folder = lay.state_dir / "qconf"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    qconf(lay, option, str(path))


# --- up, status, down -------------------------------------------------------------------------


@dataclass(frozen=True)
class GridEngineStatus:
    """What runs: the namespace, the qmaster, and each host's load as qhost reports it
    (``-``: its execd has not reported)."""

    namespace: bool
    qmaster: bool
    hosts: tuple[tuple[str, str], ...]  # (name, load average or "-")

    @property
    def up(self) -> bool:
        names = {name for name, load in self.hosts if load != "-"}
        return self.namespace and self.qmaster and names >= {h.name for h in HOSTS}


def status(lay: Layout) -> GridEngineStatus:
    if holder_pid(lay) is None:
        return GridEngineStatus(False, False, ())
    proc = run_inside(lay, ["qhost"], check=False, timeout=20)
    if proc.returncode != 0:
        return GridEngineStatus(True, False, ())
    return GridEngineStatus(True, True, parse_qhost_loads(proc.stdout))


def parse_qhost_loads(text: str) -> tuple[tuple[str, str], ...]:
    """(host, LOAD column) of each host line of plain ``qhost`` output (``global`` left out);
    the column is found by the header's name."""
    rows = []
    column = None
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "HOSTNAME" and "LOAD" in fields:
            column = fields.index("LOAD")
            continue
        if column is None or len(fields) <= column or fields[0] == "global":
            continue
        rows.append((fields[0], fields[column]))
    return tuple(rows)


@dataclass(frozen=True)
class GridEngineUp:
    layout: Layout
    already_up: bool
    seconds: float
    status: GridEngineStatus


def up(state_dir: Path | None = None, *, timeout: float = 90, say: Say = _quiet) -> GridEngineUp:
    """Root (cached), namespace, qmaster, configuration, three execds; waits until every
    host reports. A no-op when it is up."""
    started = time.monotonic()
    if os.geteuid() != 0:
        raise UsageError("sandbox up --scheduler gridengine must run as root (namespaces, mounts)")
    lay = layout(state_dir)
    ensure_root(lay, say)
    if holder_pid(lay) is not None:
        st = status(lay)
        if st.up:
            return GridEngineUp(lay, True, time.monotonic() - started, st)
        say("the Grid Engine sandbox is partly up: taking it down first")
        down(lay.state_dir, say=say)
    _prepare_state(lay)
    pid = _start_holder(lay)
    say(f"namespace up (pid {pid}); starting sge_qmaster")
    try:
        _start_qmaster(lay, timeout)
        _configure(lay)
        for h in HOSTS:
            _start_execd(lay, pid, h)
        st = _wait_for_hosts(lay, timeout)
    except BaseException:
        say("bring-up failed; ending the namespace")
        _end_namespace(lay)
        raise
    _write_wrappers(lay)
    return GridEngineUp(lay, False, time.monotonic() - started, st)


def _prepare_state(lay: Layout) -> None:
    """Folders, the spool and common folder seeded from the root's (first up only), hosts,
    the stand-in NVML library and scenarios, the source-address preload."""
    lay.state_dir.mkdir(parents=True, exist_ok=True)
    lay.state_dir.chmod(0o755)
    for folder, inside in ((lay.spool, SPOOL), (lay.common, f"{SGE_ROOT}/{SGE_CELL}/common")):
        if not folder.exists():
            tmp = folder.with_name(folder.name + ".new")
            if tmp.exists():
                shutil.rmtree(tmp)
            # cp -a: the files keep their owner, the root's sgeadmin (the qmaster runs as it)
            host.run(["cp", "-a", str(lay.inside(inside)), str(tmp)])
            tmp.rename(folder)
    (lay.common / "act_qmaster").write_text(MASTER + "\n")
    lay.jobs.mkdir(exist_ok=True)
    lay.jobs.chmod(0o1777)
    lay.hosts.write_text(hosts_file())
    _write_standin(lay)
    build_preload(lay.preload)
    lay.ld_so_preload.write_text(f"{lay.preload}\n")


def _write_standin(lay: Layout) -> None:
    from clusterjob.sandbox import standin

    standin.build_standin_library(lay.lib_dir)
    makers = {"a100": standin.a100, "v100": standin.v100, "h100": standin.h100}
    for h in HOSTS:
        buses = [f"0000:{0x10 + 0x10 * i:02x}:00.0" for i in range(h.gpus)]
        gpus = standin.gpus_on_buses(makers[h.gpu_type], buses, node=h.name)
        path = standin.write_scenario(lay.scenario(h.name), standin.StandinScenario(gpus))
        path.chmod(0o644)


def build_preload(dest: Path) -> Path:
    """Compile ``gridengine_source_address.c`` with the system's cc; reused while newer
    than its source."""
    if dest.exists() and dest.stat().st_mtime >= PRELOAD_SOURCE.stat().st_mtime:
        return dest
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        raise ClusterjobError(
            "no C compiler (cc): the Grid Engine sandbox compiles a small preload library "
            "(Debian: apt-get install gcc)"
        )
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(dest.name + ".tmp")
    host.run([cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", str(tmp), str(PRELOAD_SOURCE), "-ldl"])
    tmp.chmod(0o755)
    tmp.replace(dest)
    return dest


def _start_qmaster(lay: Layout, timeout: float) -> None:
    run_inside(lay, ["/usr/sbin/sge_qmaster"], timeout=30)
    deadline = time.monotonic() + timeout
    while True:
        proc = run_inside(lay, ["qconf", "-sh"], check=False, timeout=20)
        if proc.returncode == 0:
            return
        if time.monotonic() > deadline:
            last = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
            raise ClusterjobError(
                f"sge_qmaster did not answer in {timeout:.0f}s: {last[-1] if last else '-'}"
            )
        time.sleep(0.2)


def _start_execd(lay: Layout, pid: int, h: GridEngineHost) -> None:
    """One execd, in a UTS namespace of its own named after its host (it names itself by
    gethostname), with ``execd_env``; it puts itself in the background."""
    argv = ["/usr/bin/env", "-i", *_env_args(execd_env(h, lay)), "/usr/sbin/sge_execd"]
    host.run(_nsenter(pid, argv, uts_name=h.name), timeout=30)


def _configure(lay: Layout) -> None:
    """Global and scheduler configuration, the GPU complexes, hosts, host group, queue:
    applied at every up (qconf replaces each whole)."""
    glob = qconf(lay, "-sconf", "global").stdout
    _qconf_file(lay, "-Mconf", "global", edit_config(glob, GLOBAL_CHANGES))
    sched = qconf(lay, "-ssconf").stdout
    _qconf_file(lay, "-Msconf", "sched_configuration", edit_config(sched, SCHEDULER_CHANGES))
    _qconf_file(lay, "-Mc", "complexes", complexes(qconf(lay, "-sc").stdout))
    admin = set(qconf(lay, "-sh").stdout.split())
    submit = set(qconf(lay, "-ss", check=False).stdout.split())
    execs = set(qconf(lay, "-sel", check=False).stdout.split())
    for name in [MASTER, *(h.name for h in HOSTS)]:
        if name not in admin:
            qconf(lay, "-ah", name)
        if name not in submit:
            qconf(lay, "-as", name)
    for h in HOSTS:
        _qconf_file(lay, "-Me" if h.name in execs else "-Ae", h.name, exechost_config(h))
    groups = set(qconf(lay, "-shgrpl", check=False).stdout.split())
    option = "-Mhgrp" if HOSTGROUP in groups else "-Ahgrp"
    _qconf_file(lay, option, HOSTGROUP, hostgroup_config())
    queues = set(qconf(lay, "-sql", check=False).stdout.split())
    prolog = epilog = "NONE"
    if _install_hooks(lay):
        prolog, epilog = f"root@{lay.hook('prolog')}", f"root@{lay.hook('epilog')}"
    config = queue_config(prolog=prolog, epilog=epilog)
    _qconf_file(lay, "-Mq" if QUEUE in queues else "-Aq", QUEUE, config)


def _install_hooks(lay: Layout) -> bool:
    """clusterjob, the sandbox's site and the GPU binding hooks, for the root's python3;
    False (no hooks: jobs bind their GPUs in their first step, where clusterjob is) when
    this python is not the root's version, whose compiled modules the copy would need."""
    import importlib.util
    import sys

    import clusterjob

    hostlist = importlib.util.find_spec("hostlist")  # a top-level module of site-packages
    if sys.version_info[:2] != NODE_PYTHON_VERSION or hostlist is None or not hostlist.origin:
        return False
    site_packages = Path(hostlist.origin).parent
    tmp = lay.node_lib.with_name(lay.node_lib.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    skip = shutil.ignore_patterns("__pycache__")
    shutil.copytree(Path(clusterjob.__file__).parent, tmp / "clusterjob", ignore=skip)
    for name in NODE_MODULES:
        src = site_packages / name
        if src.is_dir():
            shutil.copytree(src, tmp / name, ignore=skip)
        elif src.exists():
            shutil.copy2(src, tmp / name)
    shutil.rmtree(lay.node_lib, ignore_errors=True)
    tmp.rename(lay.node_lib)
    lay.site_file.write_text(sandbox_site())
    for name, command in (("prolog", "bind-gpus"), ("epilog", "release-gpus")):
        path = lay.hook(name)
        path.parent.mkdir(exist_ok=True)
        path.write_text(hook_script(command, lay))
        path.chmod(0o755)
    return True


def _wait_for_hosts(lay: Layout, timeout: float) -> GridEngineStatus:
    deadline = time.monotonic() + timeout
    while True:
        st = status(lay)
        if st.up:
            return st
        if time.monotonic() > deadline:
            silent = [n for n, load in st.hosts if load == "-"]
            raise ClusterjobError(
                f"execution hosts not reporting after {timeout:.0f}s: {', '.join(silent)} "
                f"(logs: {lay.spool}/execd/HOST/messages)"
            )
        time.sleep(0.3)


def _write_wrappers(lay: Layout) -> None:
    lay.bin_dir.mkdir(exist_ok=True)
    for command in CLIENT_COMMANDS:
        path = lay.bin_dir / command
        path.write_text(wrapper_script(command, lay))
        path.chmod(0o755)


def exports(lay: Layout) -> list[str]:
    """``export`` lines for a shell; PATH keeps the caller's ``$PATH`` after the wrappers."""
    lines = [f'export PATH={shlex.quote(str(lay.bin_dir))}:"$PATH"']
    lines.append(f"export {envvars.GE_SANDBOX_JOBS}={shlex.quote(str(lay.jobs))}")
    return lines


def namespace_of(pid: int) -> str | None:
    """The PID namespace ``pid`` is in (``pid:[4026532...]``); None when it is gone."""
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def processes_in_namespace(namespace: str) -> list[int]:
    """Every process in that PID namespace: this sandbox's, not another one's in the same
    root (each Grid Engine sandbox has its own namespaces, so several can run at once)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and namespace_of(int(entry.name)) == namespace:
            found.append(int(entry.name))
    return found


def _end_namespace(lay: Layout, timeout: float = 15) -> bool:
    """SIGKILL to the namespace's pid 1 ends every process in it (and so its mounts and
    network); then wait for them and unshare to go. True when something was running."""
    pid = holder_pid(lay)
    ran = pid is not None
    namespace = None if pid is None else namespace_of(pid)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while namespace and processes_in_namespace(namespace) and time.monotonic() < deadline:
        time.sleep(0.05)
    record = host.read_pid(lay.pid_dir, "unshare")
    if record is not None:
        while record.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if record.alive():
            ran = True
            host.stop(record, lay.pid_dir)
        (lay.pid_dir / "unshare.pid").unlink(missing_ok=True)
    lay.holder_pid.unlink(missing_ok=True)
    (lay.state_dir / "namespace.ready").unlink(missing_ok=True)
    left = processes_in_namespace(namespace) if namespace else []
    if left:
        raise ClusterjobError(f"processes still running in the Grid Engine sandbox: {left}")
    return ran


def down(state_dir: Path | None = None, *, purge: bool = False, say: Say = _quiet) -> bool:
    """Stop the execds and the qmaster (so the spool is closed cleanly), then end the
    namespace; True when something ran. ``purge``: delete the state directory too."""
    if os.geteuid() != 0:
        raise UsageError("sandbox down --scheduler gridengine must run as root")
    lay = layout(state_dir)
    if holder_pid(lay) is not None:
        qconf(lay, "-ke", "all", check=False)
        qconf(lay, "-km", check=False)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and _runs_inside(lay, "sge_qmaster"):
            time.sleep(0.2)
    ran = _end_namespace(lay)
    if purge and lay.state_dir.is_dir():
        shutil.rmtree(lay.state_dir)
    return ran


def _runs_inside(lay: Layout, name: str) -> bool:
    pid = holder_pid(lay)
    namespace = None if pid is None else namespace_of(pid)
    for member in processes_in_namespace(namespace) if namespace else []:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{member}/comm").read_text().strip() == name:
                return True
    return False


def describe(st: GridEngineStatus, lay: Layout) -> list[str]:
    """`sandbox status` lines."""
    lines = [f"namespace      {'running' if st.namespace else 'stopped'}"]
    lines.append(f"sge_qmaster    {'answering' if st.qmaster else 'not answering'}")
    reported = dict(st.hosts)
    for h in HOSTS:
        load = reported.get(h.name, "-")
        state = "reporting" if load != "-" else "not reporting"
        lines.append(f"host {h.name:<9} {state}  gpu={h.gpus} gpu_type={h.gpu_type}")
    word = "up" if st.up else ("stopped" if not st.namespace else "partly up")
    lines.append(f"Grid Engine sandbox {word} ({lay.state_dir})")
    return lines
