"""Sandboxes of Slurm releases the host does not ship: one Debian root file system each.

The host's own Slurm runs the sandbox directly (``cluster``). For another release, ``up``
builds (once, cached) a root of the Debian suite that ships it with ``mmdebstrap``,
bind-mounts ``/proc``, ``/dev``, this clusterjob's tree and the release's state directory
into it at their own paths, installs this clusterjob into a venv of that suite's Python,
and runs ``clusterjob sandbox up`` inside with ``chroot``: munge, MariaDB, slurmdbd,
slurmctld, the slurmds, the Slurm clients and clusterjob are all of that release. ``down``
stops them the same way, ends whatever still runs in the root, and unmounts all of it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from clusterjob import envvars
from clusterjob.errors import ClusterjobError, UsageError
from clusterjob.sandbox import config, host, runtime

Say = Callable[[str], None]

# The root file systems (one folder per suite) and the build logs; kept between runs.
DEFAULT_ROOTS_DIR = Path("/var/cache/clusterjob-sandbox")
MIRROR = "http://deb.debian.org/debian"
# What the sandbox needs inside (host.PACKAGES' names), a Python for clusterjob, and what
# scripts/test.sh installs on the host for the tests: libslurm-dev (the SPANK stand-in of the
# --container-image test), git, OpenSSH and rsync (the --host tests' own sshd).
ROOT_PACKAGES = (
    "slurm-wlm",
    "slurmdbd",
    "slurm-client",
    "munge",
    "mariadb-server",
    "mariadb-client",
    "gcc",
    "libc6-dev",
    "python3",
    "python3-venv",
    "ca-certificates",
    "util-linux",
    "procps",
    "passwd",
    "libslurm-dev",
    "git",
    "openssh-server",
    "openssh-client",
    "rsync",
    "bsdutils",  # script(1), the terminal of the shell-over-ssh test: sid no longer has it
)
# sid's Release file on some mirrors is past its Valid-Until date.
APT_OPTIONS = ('Acquire::Check-Valid-Until "false"',)
VENV = Path("/opt/clusterjob-venv")  # inside the root
# Debian's CA bundle, with whatever CA the host's admin added: copied into the root.
CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
PATH_INSIDE = f"{VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Release:
    """A Slurm release run in a Debian root: its suite, where the root and its state live."""

    version: str  # "24.11"
    suite: str  # "trixie"
    roots_dir: Path
    state_dir: Path

    @property
    def root(self) -> Path:
        return self.roots_dir / "roots" / self.suite

    def inside(self, path: Path) -> Path:
        """Where ``path`` (absolute, as seen inside the root) lies on the host."""
        return self.root / path.relative_to("/")


def roots_dir() -> Path:
    env = os.environ.get(envvars.SANDBOX_ROOTS)
    return Path(env).absolute() if env else DEFAULT_ROOTS_DIR


def release(version: str, state_dir: Path | None = None) -> Release:
    """The release ``version`` names; an unknown one is a usage error naming the known."""
    suite = config.RELEASE_SUITES.get(version)
    if suite is None:
        known = ", ".join(config.RELEASE_SUITES)
        raise UsageError(f"--slurm {version}: not a release the sandbox knows (known: {known})")
    default = Path(f"{config.DEFAULT_STATE_DIR}-{version}")
    return Release(version, suite, roots_dir(), (state_dir or default).absolute())


def needs_root(version: str | None) -> bool:
    """Whether ``--slurm version`` runs in a root: any release but the host's own."""
    from clusterjob.sandbox import cluster

    return version is not None and version != cluster.slurm_release()


# --- the root file system --------------------------------------------------------------------


def _recipe(rel: Release) -> str:
    return root_recipe(rel.suite, ROOT_PACKAGES)


def root_recipe(suite: str, packages: Sequence[str], hooks: Sequence[str] = ()) -> str:
    """What a root is built from; kept in its stamp, so a changed recipe builds it again."""
    lines = [f"suite {suite}", f"mirror {MIRROR}", *packages, *APT_OPTIONS]
    return "\n".join([*lines, *(f"hook {h}" for h in hooks), ""])


def _stamp(rel: Release) -> Path:
    return rel.root / ".clusterjob-root"


def ensure_root(rel: Release, say: Say = _quiet) -> bool:
    """Build the root unless one of the same recipe is there; True when built now."""
    return build_root(rel.root, rel.suite, ROOT_PACKAGES, what=f"Slurm {rel.version}", say=say)


def build_root(
    root: Path,
    suite: str,
    packages: Sequence[str],
    *,
    what: str,
    essential_hooks: Sequence[str] = (),
    say: Say = _quiet,
) -> bool:
    """Build a Debian ``suite`` root at ``root`` with ``packages`` (mmdebstrap), unless one of
    the same recipe is there; True when built now. ``essential_hooks``: shell commands run
    before the packages are installed (``$1`` is the root), e.g. debconf answers. The Slurm
    release roots and the Grid Engine sandbox's root are both built here."""
    stamp = root / ".clusterjob-root"
    recipe = root_recipe(suite, packages, essential_hooks)
    if stamp.exists() and stamp.read_text() == recipe:
        return False
    if _mounts_under_path(root):
        raise ClusterjobError(f"{root} is in use (mounted); `sandbox down` it first")
    if shutil.which("mmdebstrap") is None:
        say("installing mmdebstrap (apt-get)")
        host.install_packages(["mmdebstrap"])
    new = root.with_name(root.name + ".new")
    if new.exists():
        shutil.rmtree(new)
    new.parent.mkdir(parents=True, exist_ok=True)
    log = root.parent.parent / f"build-{root.name}.log"
    say(f"building a Debian {suite} root for {what} (log: {log})")
    cmd = [
        "mmdebstrap",
        "--variant=apt",
        "--mode=root",
        f"--include={','.join(packages)}",
        *(f"--aptopt={opt}" for opt in APT_OPTIONS),
        *(f"--essential-hook={hook}" for hook in essential_hooks),
        suite,
        str(new),
        MIRROR,
    ]
    with open(log, "w") as out:
        done = subprocess.run(
            cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=1800
        )
    if done.returncode != 0:
        raise ClusterjobError(
            f"mmdebstrap {suite} failed (exit {done.returncode}): "
            f"{host.last_error_line(log)} (log: {log})"
        )
    if root.exists():
        shutil.rmtree(root)
    new.rename(root)
    stamp.write_text(recipe)
    return True


def _install_source(rel: Release) -> tuple[str, list[str]]:
    """(stamp text, pip install arguments) for this clusterjob in ``rel``'s venv: a checkout
    editable with its test tools (bound into the root at its own path); an install (a wheel,
    pipx, `uv tool`) from a wheel of its own files, put in the release's state dir, which
    is bound too. pip used to be given the running interpreter's site-packages as a project."""
    if runtime.is_checkout():
        digest = hashlib.sha256((_PACKAGE_ROOT / "pyproject.toml").read_bytes()).hexdigest()
        return f"{_PACKAGE_ROOT}\n{digest}\n", ["-e", f"{_PACKAGE_ROOT}[test]"]
    wheel = runtime.wheel_of_running(rel.state_dir / "wheel")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    return f"{wheel}\n{digest}\n", [str(wheel)]


def ensure_venv(rel: Release, say: Say = _quiet) -> bool:
    """This clusterjob in a venv of the suite's Python (``_install_source``); reinstalled when
    it changed. True when (re)installed."""
    stamp = rel.inside(VENV) / ".clusterjob-venv"
    want, install = _install_source(rel)
    if stamp.exists() and stamp.read_text() == want:
        return False
    say(f"installing clusterjob into {VENV} of the {rel.suite} root (pip)")
    run_inside(rel, ["python3", "-m", "venv", "--clear", str(VENV)], timeout=300)
    # The host's pip configuration names host paths; inside, pip reads none of it and
    # trusts the CAs the host trusts (``mount`` copied the bundle in).
    pip = [str(VENV / "bin/python"), "-m", "pip", "--isolated", "--cert", CA_BUNDLE]
    run_inside(rel, [*pip, "install", "-q", "--upgrade", "pip"], timeout=600)
    run_inside(rel, [*pip, "install", "-q", *install], timeout=1800)
    stamp.write_text(want)
    return True


# --- mounts -----------------------------------------------------------------------------------


def _mount_points() -> list[Path]:
    """Every mount point of this machine, from /proc/self/mountinfo (octal escapes undone)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        field = line.split()[4]
        points.append(Path(field.encode().decode("unicode_escape")))
    return points


def mounts_under(rel: Release) -> list[Path]:
    return _mounts_under_path(rel.root)


def _mounts_under_path(root: Path) -> list[Path]:
    return [p for p in _mount_points() if p == root or root in p.parents]


def is_mounted(rel: Release) -> bool:
    return bool(mounts_under(rel))


def _binds(rel: Release) -> list[Path]:
    """Host folders seen inside at their own paths: the clusterjob tree (a checkout's), the
    state dir."""
    return [_PACKAGE_ROOT, rel.state_dir] if runtime.is_checkout() else [rel.state_dir]


def mount(rel: Release) -> None:
    """/proc, /dev (its submounts kept from propagating back) and the binds; idempotent.
    /etc/hosts and /etc/resolv.conf are copied: node names resolve inside as outside."""
    rel.state_dir.mkdir(parents=True, exist_ok=True)
    os.chown(rel.state_dir, 0, 0)
    rel.state_dir.chmod(0o755)
    present = set(_mount_points())
    proc, dev = rel.root / "proc", rel.root / "dev"
    if proc not in present:
        host.run(["mount", "-t", "proc", "proc", str(proc)])
    if dev not in present:
        host.run(["mount", "--rbind", "/dev", str(dev)])
        host.run(["mount", "--make-rslave", str(dev)])
    for source in _binds(rel):
        target = rel.inside(source)
        if target in present:
            continue
        target.mkdir(parents=True, exist_ok=True)
        host.run(["mount", "--bind", str(source), str(target)])
    for name in ("/etc/hosts", "/etc/resolv.conf", CA_BUNDLE):
        if not Path(name).exists():
            continue
        inside = rel.inside(Path(name))
        inside.unlink(missing_ok=True)  # resolv.conf may be a link to the host's /run
        shutil.copyfile(name, inside)


def processes_in(root_dir: Path) -> list[int]:
    """Pids of the processes whose root directory is ``root_dir`` (what runs inside it)."""
    found = []
    root = str(root_dir)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.readlink(entry / "root") == root:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def end_processes(rel: Release, timeout: float = 15) -> list[int]:
    """SIGTERM, then SIGKILL, to whatever still runs inside the root; their pids."""
    pids = processes_in(rel.root)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in processes_in(rel.root):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + timeout
        while processes_in(rel.root) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not processes_in(rel.root):
            break
    return pids


def unmount(rel: Release) -> list[Path]:
    """Unmount everything under the root, deepest first; what was unmounted."""
    done: list[Path] = []
    for _ in range(3):  # an rbind's submounts may come back into view as their parents go
        points = sorted(set(mounts_under(rel)), key=lambda p: len(p.parts), reverse=True)
        if not points:
            break
        for point in points:
            proc = host.run(["umount", str(point)], check=False, timeout=30)
            if proc.returncode != 0 and point in _mount_points():
                host.run(["umount", "--lazy", str(point)], check=False, timeout=30)
            done.append(point)
    left = mounts_under(rel)
    if left:
        raise ClusterjobError(f"still mounted after down: {', '.join(map(str, left))}")
    return done


# --- running inside ----------------------------------------------------------------------------


# How this machine reaches the package registries (its CA bundle, a proxy): pip, pipx and uv
# inside need the same. A path is passed on only where it exists inside the root too.
NETWORK_ENV = frozenset(
    {
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "http_proxy",
        "https_proxy",
        "no_proxy",
    }
)


def inside_env(rel: Release, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """A clean environment for a command inside: the venv first on PATH, the sandbox's
    clients (SLURM_CONF, CLUSTERJOB_SITE, CLUSTERJOB_SANDBOX_DIR); CLUSTERJOB_* and TERM of
    the caller carried over, and how it reaches the package registries (``NETWORK_ENV``)."""
    from clusterjob.sandbox import cluster

    env = {"PATH": PATH_INSIDE, "HOME": "/root", "LANG": "C.UTF-8", "USER": "root"}
    for name, value in os.environ.items():
        own = name.startswith("CLUSTERJOB_") or name in ("TERM", "COLUMNS")
        network = name in NETWORK_ENV and (
            not value.startswith("/") or rel.inside(Path(value)).exists()
        )
        if own or network:
            env[name] = value
    env.update(cluster.client_env(rel.state_dir))
    env[envvars.SANDBOX_DIR] = str(rel.state_dir)
    env.pop(envvars.SANDBOX_ROOTS, None)
    env.pop(envvars.SANDBOX_SLURM, None)
    env.update(extra or {})
    return env


def chroot_argv(rel: Release, argv: Sequence[str], cwd: Path | None = None) -> list[str]:
    """``chroot ROOT`` running ``argv`` in ``cwd`` (when it exists inside, else /root)."""
    where = cwd if cwd is not None and rel.inside(cwd).is_dir() else Path("/root")
    return ["chroot", str(rel.root), "/bin/sh", "-c", 'cd "$0" && exec "$@"', str(where), *argv]


def run_inside(
    rel: Release, argv: Sequence[str], *, timeout: float = 600, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run a command inside to completion; fail with its last line of output."""
    cmd = chroot_argv(rel, argv)
    what = f"{' '.join(argv[:4])} (in the {rel.suite} root)"
    try:
        proc = subprocess.run(
            cmd,
            env=inside_env(rel),
            capture_output=capture,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as exc:
        raise ClusterjobError(f"{what}: no answer in {timeout:.0f}s") from exc
    if proc.returncode != 0:
        lines = ((proc.stderr or "") + (proc.stdout or "")).strip().splitlines()
        last = lines[-1] if lines else "no output"
        raise ClusterjobError(f"{what} failed (exit {proc.returncode}): {last}")
    return proc


def exec_inside(rel: Release, argv: Sequence[str], cwd: Path) -> int:
    """``sandbox exec``: a command inside the running sandbox, on this terminal; its status."""
    if not is_mounted(rel) or not (rel.state_dir / "slurm.conf").exists():
        up = f"clusterjob sandbox up --slurm {rel.version}"
        raise UsageError(f"the Slurm {rel.version} sandbox is not up: {up}")
    if not argv:
        raise UsageError("sandbox exec: name a command, e.g. sandbox exec -- sinfo -V")
    return subprocess.run(chroot_argv(rel, argv, cwd), env=inside_env(rel)).returncode


# --- up and down -------------------------------------------------------------------------------


def up(
    rel: Release,
    *,
    hooks: bool = True,
    timeout: float = 120,
    say: Say = _quiet,
    like: Path | None = None,
    nodes: str | None = None,
) -> str:
    """Root, mounts, venv, then ``clusterjob sandbox up`` inside; what that printed. ``like``:
    a site file, copied into the release's state dir (seen inside) for `up --like`;
    ``nodes``: its `--nodes`."""
    if os.geteuid() != 0:
        raise UsageError("sandbox up must run as root (it builds a root file system, mounts)")
    ensure_root(rel, say)
    mount(rel)
    ensure_venv(rel, say)
    argv = ["clusterjob", "sandbox", "up", "--state-dir", str(rel.state_dir)]
    if like is not None:
        given = rel.state_dir / "like-given.yaml"
        shutil.copyfile(like, given)
        argv += ["--like", str(given)]
    argv += [] if nodes is None else ["--nodes", nodes]
    argv += [] if hooks else ["--no-hooks"]
    argv += ["--timeout", str(timeout)]
    say(f"starting the Slurm {rel.version} sandbox inside the {rel.suite} root")
    proc = run_inside(rel, argv, timeout=timeout + 600)
    for line in proc.stderr.splitlines():
        say(line.removeprefix("sandbox: "))
    return proc.stdout


def down(rel: Release, *, purge: bool = False, say: Say = _quiet) -> list[str]:
    """Stop the daemons inside (as the host's ``down`` does), end anything left in the
    root, unmount. Returns what was stopped."""
    if os.geteuid() != 0:
        raise UsageError("sandbox down must run as root")
    stopped: list[str] = []
    if rel.root.is_dir() and (rel.state_dir / "pids").is_dir():
        if not is_mounted(rel):
            mount(rel)  # the daemons' pid files are read inside, where their names resolve
        argv = ["clusterjob", "sandbox", "down", "--state-dir", str(rel.state_dir)]
        try:
            proc = run_inside(rel, argv, timeout=300)
        except ClusterjobError as exc:
            # e.g. the root's clusterjob is another checkout's, not mounted now: the daemons
            # are ended below all the same, and nothing is left mounted
            say(f"the {rel.suite} root's own `sandbox down` failed ({exc}); ending its processes")
        else:
            for line in proc.stderr.splitlines():
                say(line.removeprefix("sandbox: "))
                if line.startswith("sandbox: stopping "):
                    stopped.append(line.split()[2])
    left = end_processes(rel)
    if left:
        say(f"ended {len(left)} process(es) left in the {rel.suite} root")
    still = processes_in(rel.root)
    if still:  # unmounting under them would leave them without /proc and /dev
        pids = " ".join(map(str, still))
        raise ClusterjobError(
            f"processes still running in {rel.root} (pids {pids}); not unmounting"
        )
    unmount(rel)
    if purge and rel.state_dir.is_dir():
        shutil.rmtree(rel.state_dir)
    return stopped


def status_text(rel: Release) -> tuple[bool, str]:
    """(up?, what ``clusterjob sandbox status`` says inside); stopped when not mounted."""
    if not is_mounted(rel):
        return False, f"sandbox stopped (Slurm {rel.version}: nothing mounted in {rel.root})"
    proc = subprocess.run(
        chroot_argv(rel, ["clusterjob", "sandbox", "status", "--state-dir", str(rel.state_dir)]),
        env=inside_env(rel),
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    return proc.returncode == 0, proc.stdout + proc.stderr


def holds_state_dir(rel: Release, state_dir: Path) -> bool:
    """Whether ``rel``'s root has ``state_dir`` bound into it (its sandbox keeps state there)."""
    return rel.inside(state_dir.absolute()) in _mount_points()


def mounted_releases() -> list[Release]:
    """The releases whose root is mounted now (a sandbox up, or a `down` that failed)."""
    return [r for r in map(release, config.RELEASE_SUITES) if is_mounted(r)]
