"""Bring the local sandbox cluster up, take it down, say how it is.

Everything lives under one state directory: configs, our own munged (own key and socket),
our own MariaDB (own data dir, socket and port), slurmdbd, slurmctld and one slurmd per node,
the stand-in NVML library and one scenario per node. Daemons run in the foreground mode,
detached, with pid files written by us, so ``down`` stops exactly what ``up`` started.
"""

from __future__ import annotations

import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.node.wrappers import install_wrappers
from clusterjob.sandbox import config, host, runtime, shape
from clusterjob.sandbox.config import Layout, Ports
from clusterjob.sandbox.shape import shape_of
from clusterjob.sandbox.standin import StandinGpu
from clusterjob.site.model import QosLimits

# Ports come from config.port_range(release): below Linux's ephemeral range (32768-60999),
# so a client connection's local port can never take a daemon's port between `down` and `up`
# (seen: slurmd "Address already in use"); one block of the range per Slurm release.
MUNGE_USER = "munge"
MYSQL_USER = "mysql"

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


def resolve_state_dir(option: Path | None = None) -> Path:
    """The host sandbox's state dir: --state-dir, else $CLUSTERJOB_SANDBOX_DIR, else the
    default (``clusterjob.sandbox.which`` says which sandbox a command means)."""
    return config.named_state_dir(option)[0] or config.DEFAULT_STATE_DIR


def controller_running(state_dir: Path) -> bool:
    """Whether the sandbox in ``state_dir`` has its slurmctld running (started by us)."""
    layout = Layout(state_dir)
    rec = host.read_pid(layout.pid_dir, "slurmctld")
    return layout.slurm_conf.exists() and rec is not None and rec.alive()


def daemon_names(layout: Layout) -> list[str]:
    """Every daemon of a sandbox, in start order (``down`` stops them in reverse)."""
    slurmds = [f"slurmd-{n.name}" for n in shape_of(layout).nodes]
    return ["munged", "mariadb", "slurmdbd", "slurmctld", *slurmds]


def client_env(state_dir: Path) -> dict[str, str]:
    """What a client needs to use the sandbox: SLURM_CONF, and its site config for clusterjob."""
    layout = Layout(state_dir)
    return {"SLURM_CONF": str(layout.slurm_conf), "CLUSTERJOB_SITE": str(layout.site_yaml)}


def _slurm_env(layout: Layout) -> dict[str, str]:
    return dict(os.environ, SLURM_CONF=str(layout.slurm_conf))


@dataclass
class DaemonStatus:
    name: str
    pid: int | None
    alive: bool
    log: Path | None


@dataclass
class SandboxStatus:
    state_dir: Path
    daemons: list[DaemonStatus]
    nodes: list[tuple[str, str, str]] = field(default_factory=list)  # (node, state, reason)
    controller: str = ""

    @property
    def up(self) -> bool:
        return (
            all(d.alive for d in self.daemons)
            and bool(self.nodes)
            and all(_node_ready(state) for _, state, _ in self.nodes)
        )

    @property
    def stopped(self) -> bool:
        return not any(d.alive for d in self.daemons)


@dataclass
class UpResult:
    state_dir: Path
    already_up: bool
    seconds: float
    status: SandboxStatus
    installed: list[str] = field(default_factory=list)


# --- status ----------------------------------------------------------------------------------


def _node_ready(state: str) -> bool:
    """A node that answers slurmctld (drained nodes answer too; down/unknown ones do not)."""
    s = state.lower()
    return not (s.endswith("*") or s.startswith(("down", "unk", "not_responding", "future")))


def _sinfo_nodes(layout: Layout) -> list[tuple[str, str, str]]:
    proc = host.run(
        ["sinfo", "-h", "-N", "-o", "%N|%T|%E"], env=_slurm_env(layout), timeout=15, check=False
    )
    if proc.returncode != 0:
        return []
    rows = {}
    for line in proc.stdout.splitlines():
        parts = line.split("|", 2)
        if len(parts) == 3:
            rows[parts[0]] = (parts[0], parts[1], parts[2] if parts[2] != "none" else "")
    return list(rows.values())


def daemon_statuses(layout: Layout) -> list[DaemonStatus]:
    """Which of the sandbox's daemons run (read from their pid files; Slurm is not asked)."""
    found = []
    for name in daemon_names(layout):
        rec = host.read_pid(layout.pid_dir, name)
        found.append(
            DaemonStatus(
                name, rec.pid if rec else None, bool(rec and rec.alive()), rec.log if rec else None
            )
        )
    return found


def status(state_dir: Path) -> SandboxStatus:
    """Which of our daemons run, and what slurmctld says about the nodes."""
    layout = Layout(state_dir)
    daemons = daemon_statuses(layout)
    result = SandboxStatus(state_dir, daemons)
    ctld = next(d for d in daemons if d.name == "slurmctld")
    if ctld.alive and layout.slurm_conf.exists():
        ping = host.run(["scontrol", "ping"], env=_slurm_env(layout), timeout=15, check=False)
        result.controller = ping.stdout.strip()
        result.nodes = _sinfo_nodes(layout)
    return result


# --- up --------------------------------------------------------------------------------------


def up(
    state_dir: Path,
    *,
    hooks: bool = True,
    timeout: float = 120,
    say: Say = _quiet,
    like: Path | None = None,
    nodes: Sequence[str] = (),
) -> UpResult:
    """Start whatever of the sandbox is not running; a no-op when all of it is. ``like``: a
    site file whose shape the cluster takes (``clusterjob.sandbox.shape``), with ``nodes``
    of its own beside one per configuration; a sandbox keeps the shape it was first brought
    up with until `down --purge`."""
    started = time.monotonic()
    if os.geteuid() != 0:
        raise UsageError("sandbox up must run as root (it starts munged, MariaDB, Slurm daemons)")
    _check_state_dir(state_dir)
    layout = Layout(state_dir)
    if like is not None:
        _take_shape(layout, like, nodes)
    elif nodes:
        raise UsageError("--nodes names nodes of the site given with --like; give --like too")
    if layout.pid_dir.is_dir():
        current = status(state_dir)
        if current.up:
            _write_node_side(layout)
            return UpResult(state_dir, True, time.monotonic() - started, current)

    installed = host.missing_packages()
    if installed:
        say(f"installing {' '.join(installed)} (apt-get)")
        host.install_packages(installed)
    _check_cgroups(slurm_release())

    running = {r.name for r in host.list_pids(layout.pid_dir) if r.alive()}
    had_hosts_line = host.has_hosts_entry(_hosts_marker(layout))
    try:
        _start(layout, hooks=hooks, deadline=time.monotonic() + timeout, say=say)
    except BaseException:
        _undo_start(layout, running, had_hosts_line, say)
        raise
    final = status(state_dir)
    return UpResult(state_dir, False, time.monotonic() - started, final, installed)


def _take_shape(layout: Layout, like: Path, nodes: Sequence[str] = ()) -> None:
    """Record the shape of the site file ``like`` for this sandbox; refused while it runs
    in another shape."""
    from clusterjob.site.loader import load_site

    site = load_site(like)
    wanted = shape.like(site, nodes)
    current = shape_of(layout)
    if current != wanted and any(r.alive() for r in host.list_pids(layout.pid_dir)):
        raise UsageError(
            f"the sandbox in {layout.state_dir} runs in another shape: "
            f"`clusterjob sandbox down --purge --state-dir {layout.state_dir}` first"
        )
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    shape.record(layout, wanted, like.read_text())


def _start(layout: Layout, *, hooks: bool, deadline: float, say: Say) -> None:
    """Every file, then every daemon not running, in order."""
    _make_dirs(layout)
    release = slurm_release()
    ports = _choose_ports(layout, config.port_range(release))
    _write_files(layout, ports, hooks=hooks, release=release)
    _make_devices(layout)
    _write_standin(layout)
    host.add_hosts_entry([n.name for n in shape_of(layout).nodes], _hosts_marker(layout))
    _ensure_munged(layout, deadline, say)
    _ensure_mariadb(layout, ports, deadline, say)
    _ensure_slurmdbd(layout, deadline, say)
    _register_accounting(layout)
    _ensure_slurmctld(layout, deadline, say)
    _register_qos(layout, deadline)
    _ensure_slurmds(layout, deadline, say)


def _undo_start(layout: Layout, running: set[str], had_hosts_line: bool, say: Say) -> None:
    """A failed `up` stops what it started and takes back its /etc/hosts line: it used to
    leave munged, MariaDB, slurmdbd and slurmctld running after slurmd failed."""
    started = [r for r in host.list_pids(layout.pid_dir) if r.alive() and r.name not in running]
    for rec in reversed(started):
        say(f"stopping {rec.name} (this start failed)")
        host.stop(rec, layout.pid_dir)
    if not had_hosts_line:
        host.remove_hosts_entry(_hosts_marker(layout))
    if not running:  # it never ran: its ports go back (its claim used to hold them)
        _release_ports(layout)


def _release_ports(layout: Layout) -> None:
    saved = layout.state_dir / "ports"
    with host.exclusive_lock(PORT_CLAIMS / ".lock"):
        for claim in PORT_CLAIMS.glob("[0-9]*"):
            if claim.read_text().split()[:1] == [str(layout.state_dir)]:
                claim.unlink(missing_ok=True)
        saved.unlink(missing_ok=True)


_SAFE_PATH = re.compile(r"^[A-Za-z0-9_./+-]+$")
MIN_FREE_BYTES = 512 << 20  # a sandbox's MariaDB, state and logs: ~200 MiB, with room to run


def _check_state_dir(state_dir: Path) -> None:
    """What the state dir must be, checked before anything starts (munged used to fail late,
    "cannot canonicalize ... Permission denied", on one under a 0700 home)."""
    if not _SAFE_PATH.match(str(state_dir)):
        raise UsageError(
            f"sandbox state dir {state_dir}: use only letters, digits and ./_+- "
            "(the path goes unquoted into slurm.conf)"
        )
    # Unix socket paths are limited to 107 bytes.
    longest = Layout(state_dir).mariadb_socket
    if len(str(longest)) > 100:
        raise UsageError(f"sandbox state dir {state_dir}: too long for a Unix socket path")
    existing = next(p for p in (state_dir, *state_dir.parents) if p.exists())
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise UsageError(
            f"sandbox state dir {state_dir}: {free >> 20} MiB free on {existing}; the sandbox "
            f"needs {MIN_FREE_BYTES >> 20} MiB (MariaDB, the daemons' logs and state)"
        )
    for p in (d for d in reversed(state_dir.parents) if d.exists()):
        st = os.stat(p)
        if st.st_uid != 0 or st.st_mode & 0o022:
            owner = "" if st.st_uid == 0 else f"owned by uid {st.st_uid}, "
            raise UsageError(
                f"sandbox state dir {state_dir}: {p} is {owner}mode "
                f"{stat.S_IMODE(st.st_mode):04o}, and the Prolog trusts no site file below a "
                "directory others can change; use a directory of root's (the default is "
                f"{config.DEFAULT_STATE_DIR})"
            )
    closed = next((p for p in state_dir.parents if p.exists() and not os.stat(p).st_mode & 1), None)
    if closed is not None:
        mode = stat.S_IMODE(os.stat(closed).st_mode)
        raise UsageError(
            f"sandbox state dir {state_dir}: {closed} is mode {mode:04o}, so the munge and "
            "mysql daemons and other users' jobs cannot reach it; use a directory they can "
            f"(the default is {config.DEFAULT_STATE_DIR})"
        )


CGROUP_ROOT = Path("/sys/fs/cgroup")


def _check_cgroups(release: str | None, root: Path | None = None) -> None:
    """A release that cannot be told ``CgroupPlugin=disabled`` (before 24.05) needs a cgroup
    file system: said before anything starts (slurmd used to fail late, its log's
    "No filesystem mounted on /sys/fs/cgroup" hidden behind "slurmd initialization failed",
    in a container or a minimal root)."""
    root = root or CGROUP_ROOT
    if release is None or config.cgroup_conf(release) is not None or os.path.ismount(root):
        return
    raise UsageError(
        f"Slurm {release}'s slurmd needs a cgroup file system and none is mounted on {root}: "
        f"mount one (mount -t cgroup2 none {root}) or run a release that can do without "
        "(sandbox up --slurm 24.11)"
    )


def _hosts_marker(layout: Layout) -> str:
    return f"{config.HOSTS_MARKER} {layout.state_dir}"


def _make_dirs(layout: Layout) -> None:
    """Root-owned and not group/world-writable: the Prolog refuses files anyone could change."""
    s = layout.state_dir
    for d in (
        s,
        layout.lib_dir,
        layout.nvml_dir,
        layout.dev_dir,
        layout.hooks_dir,
        layout.bin_dir,
        layout.log_dir,
        layout.cache_dir,
        layout.pid_dir,
        s / "run",
        s / "slurmctld",
        *(s / "slurmd" / n.name for n in shape_of(layout).nodes),
        *(layout.dev_dir / n.name for n in shape_of(layout).nodes),
    ):
        d.mkdir(parents=True, exist_ok=True)
        os.chown(d, 0, 0)
        d.chmod(0o755)
    # Daemons that drop privileges own their own folders, and all that is in them: a Debian
    # root rebuilt with other packages gives munge and mysql other ids, while the state
    # directory of that release is kept (seen: MariaDB "ibdata1 must be writable").
    for d, user, mode in (
        (layout.munge_dir, MUNGE_USER, 0o755),
        (layout.mariadb_dir, MYSQL_USER, 0o700),
        (layout.mariadb_socket.parent, MYSQL_USER, 0o755),
        (_mariadb_tmp(layout), MYSQL_USER, 0o700),
    ):
        d.mkdir(parents=True, exist_ok=True)
        owner = pwd.getpwnam(user)
        for path in (d, *d.rglob("*")):  # a few hundred files at most
            if path.lstat().st_uid != owner.pw_uid:
                os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)
        d.chmod(mode)


def slurm_release() -> str | None:
    """The release of the Slurm installed here (``24.11``), None when there is none. slurmd
    says it without a config (22.05's sinfo -V wants one first)."""
    try:
        slurmd = host.which("slurmd")
    except ClusterjobError:
        return None
    return config.release_of(host.run([slurmd, "-V"], timeout=30, check=False).stdout)


# Every sandbox on this machine claims its block of ports here, under one lock, before any
# daemon binds them: two `up`s at the same moment used to find the same block free and the
# second failed in MariaDB ("Address already in use"). Root-owned, on /run (gone at reboot,
# as the daemons are).
PORT_CLAIMS = Path("/run/clusterjob-sandbox-ports")


def _choose_ports(layout: Layout, port_range: range) -> Ports:
    """Keep the blocks this sandbox used before if they are still ours, else the first run of
    consecutive blocks (``config.blocks_for`` its nodes: one for up to 10) no other sandbox
    claims and nothing listens on; claimed for this state dir under the lock."""
    saved = layout.state_dir / "ports"
    nodes = shape_of(layout).nodes
    span = config.blocks_for(len(nodes)) * config.PORT_BLOCK
    candidates = [b for b in port_range if b + span <= port_range.stop]
    if saved.exists() and int(saved.read_text().strip()) in candidates:
        candidates.insert(0, int(saved.read_text().strip()))
    ours_running = any(r.alive() for r in host.list_pids(layout.pid_dir))
    with host.exclusive_lock(PORT_CLAIMS / ".lock"):
        taken = _port_claims_of_others(layout.state_dir)
        for base in candidates:
            ports = Ports.from_base(base, nodes)
            blocks = range(base, base + span, config.PORT_BLOCK)
            if any(b in taken for b in blocks):
                continue
            if (ours_running and base == candidates[0] and saved.exists()) or all(
                host.port_free(p) for p in ports.all()
            ):
                saved.write_text(f"{base}\n")
                for block in blocks:  # each names the sandbox and its first block
                    _write(PORT_CLAIMS / str(block), f"{layout.state_dir}\n{base}\n", 0o644)
                return ports
    raise ClusterjobError(
        f"no free run of {span} ports in {port_range.start}-{port_range.stop - 1}"
    )


def _port_claims_of_others(state_dir: Path) -> set[int]:
    """The blocks other sandboxes hold: claimed, and still named by their state dir's
    ``ports`` (a purged sandbox's claim lapses; so does a block it no longer spans)."""
    taken = set()
    for claim in PORT_CLAIMS.glob("[0-9]*"):
        lines = claim.read_text().split()
        other = Path(lines[0])
        if other == state_dir:
            continue
        first = lines[1] if len(lines) > 1 else claim.name  # a claim written before runs
        try:
            still = (other / "ports").read_text().strip() == first
        except OSError:
            still = False
        if still:
            taken.add(int(claim.name))
        else:
            claim.unlink(missing_ok=True)
    return taken


def _write(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.chown(tmp, 0, 0)
    tmp.chmod(mode)
    tmp.replace(path)


def _db_password(layout: Layout) -> str:
    path = layout.state_dir / "db-password"
    if not path.exists():
        _write(path, secrets.token_hex(16) + "\n", 0o600)
    return path.read_text().strip()


def _site_text(layout: Layout, cluster_shape: config.ClusterShape) -> str:
    """The site file clients and the hooks read: the sandbox's own, or the site a shape was
    made from, pointed at this cluster."""
    if cluster_shape.like is None:
        return config.site_yaml(layout)
    return shape.site_text(layout, str(layout.bin_dir / "clusterjob"), str(layout.prolog_log))


def _write_files(layout: Layout, ports: Ports, *, hooks: bool, release: str | None) -> None:
    """Every config, the site YAML first: gres.conf and Gres= are generated from it as loaded;
    cgroup.conf only for the releases that need one (``config.cgroup_conf``)."""
    from clusterjob.site.loader import load_site

    cluster_shape = shape_of(layout)
    _write(layout.site_yaml, _site_text(layout, cluster_shape), 0o644)
    site = load_site(layout.site_yaml)
    gres_conf, node_gres = config.gres_from_site(site, layout, cluster_shape.nodes)
    _write(layout.gres_conf, gres_conf, 0o644)
    # The node checks read NVML: a site shape whose GPUs NVML does not see (AMD's) runs
    # without the Prolog and TaskProlog, as such a site would (its jobs' preflight warns).
    checked = cluster_shape.like is None or bool(cluster_shape.nvml)
    conf = config.slurm_conf(layout, ports, node_gres, hooks=hooks and checked, shape=cluster_shape)
    _write(layout.slurm_conf, conf, 0o644)
    _write(layout.job_submit_lua, config.job_submit_lua(cluster_shape), 0o644)
    cgroup = config.cgroup_conf(release)
    if cgroup is None:
        layout.cgroup_conf.unlink(missing_ok=True)
    else:
        _write(layout.cgroup_conf, cgroup, 0o644)
    _write(layout.slurmdbd_conf, config.slurmdbd_conf(layout, ports, _db_password(layout)), 0o600)
    _write_node_side(layout)
    key = layout.munge_dir / "munge.key"
    if not key.exists():
        _write(key, "", 0o600)
        key.write_bytes(secrets.token_bytes(128))
    shutil.chown(key, MUNGE_USER, MUNGE_USER)
    key.chmod(0o600)


def _write_node_side(layout: Layout) -> None:
    """What the nodes run of clusterjob: the hooks' interpreter, the Prolog and TaskProlog
    wrappers and the node_command. Written on every `up`, a running sandbox's too, so they
    follow the clusterjob that runs `up`."""
    _make_hook_python(layout)
    # As `clusterjob site install-hooks` writes them, so the sandbox tests that very writer.
    install_wrappers(config.hook_wrappers(layout, installed=_isolated_python_imports_us()))
    for old in ("prolog", "task-prolog"):  # the names before the sandbox wrote them that way
        (layout.hooks_dir / old).unlink(missing_ok=True)
    _write(layout.bin_dir / "clusterjob", config.node_command_script(layout), 0o755)


def _make_hook_python(layout: Layout) -> None:
    """When other users cannot run this clusterjob where it is (this Python, the checkout or
    its venv in root's home), a small venv of the system's Python of the same version for the
    TaskProlog and node_command, which run as the job's user: with root's interpreter every
    other user's job failed with 126, with root's checkout at its first import. It sees this
    environment's packages where every user can reach them, else a copy of clusterjob and of
    what it imports (``runtime.copy_runtime``, made again when they change)."""
    if runtime.reachable_here():
        return
    base = runtime.world_python()
    if base is None:  # root's jobs still run; other users' cannot (said in `sandbox up`)
        return
    venv = layout.hook_python_dir
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run(
            [str(base), "-I", "-m", "venv", "--without-pip", str(venv)],
            cwd="/",
            check=True,
            capture_output=True,
            timeout=120,
        )
    site = subprocess.run(
        [str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        cwd="/",
        check=True,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout.strip()
    if all(runtime.reachable_by_all(p) for p in runtime.imported_roots()):
        here = sysconfig.get_paths()
        paths = [str(_PACKAGE_ROOT), here["purelib"], here["platlib"]]
    else:
        copied = runtime.copy_runtime(layout.runtime_dir)
        paths = [str(p) for p in copied.pythonpath()]
    _write(Path(site) / "clusterjob-sandbox.pth", "\n".join(dict.fromkeys(paths)) + "\n", 0o644)


_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent


def _isolated_python_imports_us() -> bool:
    """Whether ``python -I`` (as the hooks run it) imports this very clusterjob: true for an
    install (an editable one too), false for a source tree reached through PYTHONPATH."""
    try:
        found = subprocess.run(
            [sys.executable, "-I", "-c", "import clusterjob; print(clusterjob.__file__)"],
            cwd="/",
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return False
    here = Path(__file__).resolve().parent.parent / "__init__.py"
    return bool(found) and Path(found).resolve() == here


def _make_devices(layout: Layout) -> None:
    """gres.conf File= must name character devices: mknod them (the null device's numbers)."""
    for node in shape_of(layout).nodes:
        for dev in layout.devices(node):
            dev.parent.mkdir(exist_ok=True)  # nvidia-caps/ of a node with MIG slices
            if dev.exists() and stat.S_ISCHR(dev.stat().st_mode):
                continue
            dev.unlink(missing_ok=True)
            os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))


def _write_standin(layout: Layout) -> None:
    """The stand-in libnvidia-ml.so.1 and, per node, the GPUs NVML will report there."""
    from clusterjob.sandbox import standin

    standin.build_standin_library(layout.lib_dir)
    cluster_shape = shape_of(layout)
    for node in cluster_shape.nodes:
        own = cluster_shape.like is None
        gpus = _standin_own(node) if own else _standin_like(node, cluster_shape.nvml)
        path = standin.write_scenario(layout.scenario(node.name), standin.StandinScenario(gpus))
        os.chown(path, 0, 0)
        path.chmod(0o644)


def _standin_own(node: config.SandboxNode) -> tuple[StandinGpu, ...]:
    """The sandbox's own node's GPUs, each of its model's maker."""
    from clusterjob.sandbox import standin

    makers = {"A100": standin.a100, "V100": standin.v100, "H100": standin.h100}
    gpus = tuple(
        makers[g.model](g.bus_id, i, node=node.name, **_mig(node.name, i, g.mig))
        for i, g in enumerate(node.physical)
    )
    for gpu, want in zip(gpus, node.physical, strict=True):  # as the site YAML names them
        if gpu.name != config.MODELS[want.model].nvml_name:
            raise ClusterjobError(
                f"stand-in {want.model} is called {gpu.name!r}, "
                f"the sandbox site expects {config.MODELS[want.model].nvml_name!r}"
            )
    return gpus


def _standin_like(
    node: config.SandboxNode, nvml: Mapping[str, tuple[str, int]]
) -> tuple[StandinGpu, ...]:
    """A site-shaped node's GPUs as its node map says them, named as the site's models'
    first NVML names; GPUs NVML does not see (AMD's) are left out. All NVLinks up: a map
    that asks for some finds them."""
    from clusterjob.sandbox import standin

    return tuple(
        standin.gpu_named(
            nvml[g.model][0],
            nvml[g.model][1],
            g.bus_id,
            i,
            node=node.name,
            nvlinks=18,
            **_mig(node.name, i, g.mig),
        )  # fmt: skip
        for i, g in enumerate(node.physical)
        if g.model in nvml
    )


def _mig(node: str, index: int, profiles: tuple[str, ...]) -> dict[str, object]:
    """A stand-in GPU in MIG mode with these slices (GPU instances 1, 2, ...), or nothing."""
    from clusterjob.sandbox.standin import mig_uuid_for

    if not profiles:
        return {}
    slices = tuple((p, mig_uuid_for(node, index, k)) for k, p in enumerate(profiles))
    return {"mig_current": True, "mig_pending": True, "mig_devices": slices}


# --- daemons ---------------------------------------------------------------------------------


Probe = Callable[[], "str | None"]  # None: ready; else why not yet


def _wait(what: str, record: host.PidRecord, deadline: float, probe: Probe) -> None:
    """Probe until ready or the deadline; fail at once, with the log, if the daemon died."""
    why = "not probed"
    while True:
        if not record.alive():
            raise ClusterjobError(
                f"{record.name} exited while starting: {host.last_error_line(record.log)} "
                f"(log: {record.log})"
            )
        result = probe()
        if result is None:
            return
        why = result
        if time.monotonic() > deadline:
            raise ClusterjobError(f"{record.name} not {what} in time: {why} (log: {record.log})")
        time.sleep(0.2)


def _probe(cmd: list[str], env: dict[str, str] | None = None, expect: str = "") -> Probe:
    """A probe that runs ``cmd``: ready when it succeeds (and prints ``expect``)."""

    def probe() -> str | None:
        proc = host.run(cmd, env=env, check=False, timeout=15)
        if proc.returncode == 0 and expect in proc.stdout:
            return None

        def words(text: str) -> list[str]:
            return [ln.strip() for ln in text.splitlines() if any(c.isalnum() for c in ln)]

        err, out = words(proc.stderr), words(proc.stdout)
        return f"{cmd[0]}: {err[-1] if err else out[0] if out else 'no output'}"

    return probe


def _running(layout: Layout, name: str) -> host.PidRecord | None:
    rec = host.read_pid(layout.pid_dir, name)
    if rec is not None and rec.alive():
        return rec
    (layout.pid_dir / f"{name}.pid").unlink(missing_ok=True)
    return None


def _log(layout: Layout, name: str) -> Path:
    return layout.log_dir / f"{name}.log"


def _ensure_munged(layout: Layout, deadline: float, say: Say) -> None:
    if _running(layout, "munged"):
        return
    say("starting munged")
    layout.munge_socket.unlink(missing_ok=True)
    d = layout.munge_dir
    rec = host.spawn(
        "munged",
        [
            host.which("munged"),
            "--foreground",
            f"--socket={layout.munge_socket}",
            f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--seed-file={d / 'munged.seed'}",
            f"--log-file={d / 'munged.log'}",
        ],
        pid_dir=layout.pid_dir,
        log=_log(layout, "munged"),
        user=MUNGE_USER,
    )
    _wait("answering", rec, deadline, _probe(["munge", "-n", "-S", str(layout.munge_socket)]))


def _mariadb_client(layout: Layout, sql: str) -> list[str]:
    """The mariadb client on our server's socket, as root (unix_socket authentication)."""
    return [
        "mariadb",
        "--no-defaults",
        f"--socket={layout.mariadb_socket}",
        "-u",
        "root",
        "-N",
        "-e",
        sql,
    ]


def _mariadb_tmp(layout: Layout) -> Path:
    """MariaDB's own temporary directory: two sandboxes' `mariadb-install-db` at once in the
    shared /tmp collided on their temporary tables ("Unknown table 'mysql.tmp_user_sys'")."""
    return layout.mariadb_socket.parent / "tmp"


def _ensure_mariadb(layout: Layout, ports: Ports, deadline: float, say: Say) -> None:
    if not _running(layout, "mariadb"):
        data = layout.mariadb_dir
        if not (data / "mysql").is_dir():
            say("creating the MariaDB data directory")
            host.run(
                [
                    host.which("mariadb-install-db"),
                    "--no-defaults",
                    f"--user={MYSQL_USER}",
                    f"--datadir={data}",
                    "--auth-root-authentication-method=socket",
                    "--skip-test-db",
                    "--skip-name-resolve",
                    f"--tmpdir={_mariadb_tmp(layout)}",
                ],
                timeout=120,
            )
        say("starting mariadb")
        rec = host.spawn(
            "mariadb",
            [
                host.which("mariadbd"),
                "--no-defaults",
                f"--user={MYSQL_USER}",
                f"--datadir={data}",
                f"--socket={layout.mariadb_socket}",
                f"--tmpdir={_mariadb_tmp(layout)}",
                f"--port={ports.mariadb}",
                "--bind-address=127.0.0.1",
                "--skip-name-resolve",
                "--skip-log-bin",
                f"--pid-file={layout.mariadb_socket.parent / 'mysqld.pid'}",
                "--innodb-buffer-pool-size=256M",
                "--innodb-lock-wait-timeout=900",
                "--innodb-use-native-aio=0",
                # MariaDB 11.8 turns it on and slurmdbd warns a write conflict may be fatal;
                # `loose-`: releases without the option ignore it.
                "--loose-innodb-snapshot-isolation=OFF",
            ],
            pid_dir=layout.pid_dir,
            log=_log(layout, "mariadb"),
        )
        _wait("accepting connections", rec, deadline, _probe(_mariadb_client(layout, "SELECT 1")))
    pw = _db_password(layout)
    sql = (
        "CREATE DATABASE IF NOT EXISTS slurm_acct_db; "
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{pw}'; "
        "GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
    )
    host.run(_mariadb_client(layout, sql), timeout=30)


def _ensure_slurmdbd(layout: Layout, deadline: float, say: Say) -> None:
    if _running(layout, "slurmdbd"):
        return
    say("starting slurmdbd")
    env = _slurm_env(layout)
    rec = host.spawn(
        "slurmdbd",
        [host.which("slurmdbd"), "-D"],
        pid_dir=layout.pid_dir,
        log=_log(layout, "slurmdbd"),
        env=env,
    )
    _wait(
        "answering",
        rec,
        deadline,
        _probe(["sacctmgr", "-n", "-P", "list", "cluster", "format=cluster"], env),
    )


def _sacctmgr(layout: Layout, *args: str) -> str:
    return host.run(
        ["sacctmgr", "-i", "-n", "-P", *args], env=_slurm_env(layout), timeout=30
    ).stdout.strip()


def _register_accounting(layout: Layout) -> None:
    """The cluster and its accounts (the sandbox's, and a site shape's) with root in each, so
    jobs run under accounting."""
    cluster_shape = shape_of(layout)
    name = cluster_shape.cluster_name
    if name not in _sacctmgr(layout, "list", "cluster", "format=cluster").split():
        _sacctmgr(layout, "add", "cluster", name)
    for account in cluster_shape.accounts:
        if account not in _sacctmgr(layout, "list", "account", account, "format=account").split():
            _sacctmgr(
                layout,
                "add",
                "account",
                account,
                f"cluster={name}",
                "description=clusterjob sandbox",
                "organization=clusterjob",
            )
        if not _sacctmgr(
            layout, "list", "assoc", "user=root", f"account={account}", f"cluster={name}",
            "format=user",
        ):  # fmt: skip
            _sacctmgr(
                layout,
                "add",
                "user",
                "root",
                f"account={account}",
                f"cluster={name}",
                f"defaultaccount={config.ACCOUNT}",
            )


def _register_qos(layout: Layout, deadline: float) -> None:
    """A site shape's QoS with their limits, root allowed each. After slurmctld: a GPU limit
    names the TRES gres/gpu, which exists only once slurmctld has registered its
    AccountingStorageTRES (before, sacctmgr refused: "no TRES known by type gres/gpu")."""
    wanted = list(shape_of(layout).qos)
    if any(q.max_gpus_per_job is not None for q in wanted):
        while (
            "gres/gpu"
            not in _sacctmgr(layout, "list", "tres", "format=type,name").replace("|", "/").split()
        ):
            if time.monotonic() > deadline:
                raise ClusterjobError("slurmctld did not register the TRES gres/gpu in time")
            time.sleep(0.2)
    for qos in wanted:
        if qos.name not in _sacctmgr(layout, "list", "qos", "format=name").split():
            _sacctmgr(layout, "add", "qos", qos.name, *_qos_limits(qos))
            _sacctmgr(layout, "modify", "user", "root", "set", f"qos+={qos.name}")


def _qos_limits(qos: QosLimits) -> list[str]:
    """sacctmgr's words for a QoS's limits (what `qos:` of the site file gives)."""
    per_job = [
        f"{what}={n}"
        for what, n in (("gres/gpu", qos.max_gpus_per_job), ("node", qos.max_nodes))
        if n is not None
    ]
    limits = [f"MaxWall={qos.max_time}"] if qos.max_time else []
    return limits + ([f"MaxTRESPerJob={','.join(per_job)}"] if per_job else [])


def _ensure_slurmctld(layout: Layout, deadline: float, say: Say) -> None:
    if _running(layout, "slurmctld"):
        return
    say("starting slurmctld")
    env = _slurm_env(layout)
    rec = host.spawn(
        "slurmctld",
        [host.which("slurmctld"), "-D", "-f", str(layout.slurm_conf)],
        pid_dir=layout.pid_dir,
        log=_log(layout, "slurmctld"),
        env=env,
    )
    _wait("answering", rec, deadline, _probe(["scontrol", "ping"], env, expect="is UP"))


# A slurmd that runs but whose node slurmctld does not take (down, not responding: munged
# was dead a while) is given this long before it is restarted, which registers it again.
REGISTER_GRACE_S = 5.0


def _ensure_slurmds(layout: Layout, deadline: float, say: Say) -> None:
    env = _slurm_env(layout)
    records = []
    for node in shape_of(layout).nodes:
        rec = _running(layout, f"slurmd-{node.name}")
        started = 0.0  # a slurmd already running has registered before
        if rec is None:
            say(f"starting slurmd for {node.name}")
            started, rec = time.time(), _spawn_slurmd(layout, node.name, env)
        records.append((node.name, rec, started))

    for node_name, rec, started in records:
        ready = _registered(layout, node_name, started)
        if started:
            _wait("registered with slurmctld", rec, deadline, ready)
            continue
        try:
            _wait("registered", rec, min(deadline, time.monotonic() + REGISTER_GRACE_S), ready)
        except ClusterjobError:
            say(f"slurmd for {node_name} runs but slurmctld does not take it; restarting it")
            host.stop(rec, layout.pid_dir)
            started, rec = time.time(), _spawn_slurmd(layout, node_name, env)
            _wait(
                "registered with slurmctld", rec, deadline, _registered(layout, node_name, started)
            )


def _spawn_slurmd(layout: Layout, node: str, env: dict[str, str]) -> host.PidRecord:
    return host.spawn(
        f"slurmd-{node}",
        [host.which("slurmd"), "-D", "-f", str(layout.slurm_conf), "-N", node],
        pid_dir=layout.pid_dir,
        log=_log(layout, f"slurmd-{node}"),
        env=env,
    )


def _registered(layout: Layout, node: str, since: float) -> Probe:
    """Ready when slurmctld has the node up and registered since ``since`` (0: any time)."""

    def ready() -> str | None:
        # slurmctld keeps a node's last state across its own restart, so "idle" alone may
        # be stale: the node must also have registered since this slurmd started.
        fields = _scontrol_node(layout, node)
        state = fields.get("State", "unknown").lower()
        if not _node_ready(state):
            return f"state {state}"
        registered = _slurm_timestamp(fields.get("SlurmdStartTime", ""))
        if registered is None or registered < since - 1:
            return "not registered since it started"
        return None

    return ready


def _scontrol_node(layout: Layout, node: str) -> dict[str, str]:
    proc = host.run(
        ["scontrol", "show", "node", "-o", node], env=_slurm_env(layout), timeout=15, check=False
    )
    words = (w.partition("=") for w in proc.stdout.split())
    return {key: value for key, sep, value in words if sep}


def _slurm_timestamp(text: str) -> float | None:
    """Seconds since the epoch for Slurm's local-time ``2026-11-29T17:51:53``."""
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


def stop_daemon(state_dir: Path, name: str, *, timeout: float = 20) -> bool:
    """Stop one daemon of the sandbox by its pid record (fault tests stop slurmctld);
    True when it was running."""
    layout = Layout(state_dir)
    rec = host.read_pid(layout.pid_dir, name)
    if rec is None or not rec.alive():
        return False
    host.stop(rec, layout.pid_dir, timeout=timeout)
    return True


def start_slurmctld(state_dir: Path, *, timeout: float = 60) -> None:
    """Start slurmctld again after ``stop_daemon`` and wait until it answers and every node
    has registered with it again (slurmd keeps running meanwhile)."""
    layout = Layout(state_dir)
    deadline = time.monotonic() + timeout
    _ensure_slurmctld(layout, deadline, _quiet)
    _ensure_slurmds(layout, deadline, _quiet)


# --- down ------------------------------------------------------------------------------------


def down(
    state_dir: Path, *, timeout: float = 20, purge: bool = False, say: Say = _quiet
) -> list[str]:
    """Cancel the sandbox's jobs, stop the daemons we started (by our pid files), drop the
    /etc/hosts line. ``purge`` also deletes the state directory. Returns what was stopped."""
    if os.geteuid() != 0:
        raise UsageError("sandbox down must run as root")
    layout = Layout(state_dir)
    stopped: list[str] = []
    ctld = _running(layout, "slurmctld")
    if ctld is not None:
        _cancel_jobs(layout)
    for name in reversed(daemon_names(layout)):
        rec = host.read_pid(layout.pid_dir, name)
        if rec is None:
            continue
        if rec.alive():
            say(f"stopping {name} (pid {rec.pid})")
            stopped.append(name)
        host.stop(rec, layout.pid_dir, timeout=timeout)
    host.remove_hosts_entry(_hosts_marker(layout))
    if purge and state_dir.is_dir():
        conf = layout.slurm_conf
        if not (conf.exists() and "clusterjob sandbox" in conf.read_text()):
            raise UsageError(f"{state_dir} does not look like a sandbox state dir; not deleting it")
        shutil.rmtree(state_dir)
    return stopped


def _cancel_jobs(layout: Layout) -> None:
    """Jobs would outlive slurmd in their slurmstepd; end them first."""
    env = _slurm_env(layout)
    jobs = host.run(["squeue", "-h", "-o", "%A"], env=env, check=False, timeout=15).stdout.split()
    if not jobs:
        return
    host.run(["scancel", *jobs], env=env, check=False, timeout=15)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        left = host.run(
            ["squeue", "-h", "-t", "running,completing", "-o", "%A"],
            env=env,
            check=False,
            timeout=15,
        ).stdout.split()
        if not left:
            return
        time.sleep(0.5)
