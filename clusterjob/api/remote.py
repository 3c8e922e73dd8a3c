"""A cluster reached over ssh: host profiles, the remote work dir, code sync, the site config.

``--host`` (or ``$CLUSTERJOB_HOST``, or ``Cluster(host=...)``) is ``[USER@]HOST[:PORT]`` or
the name of a profile in ``~/.config/clusterjob/hosts.yaml``::

    hosts:
      hpc:
        host: login.hpc.example.edu   # or an alias of ~/.ssh/config
        user: ada                     # optional, as the port and the key
        port: 22
        identity: ~/.ssh/id_ed25519
        remote_dir: ~/work/myproject  # where the code goes and jobs run
        sync: true                    # false: remote_dir already holds the code
        exclude: [data/, "*.ckpt"]    # more than the default excludes and .gitignore
        python: ~/envs/torch/bin/python   # the jobs' Python on the cluster
        site: hpc                     # a site config here; default: the cluster's own
        ssh_options: [StrictHostKeyChecking=yes]

The site config is the cluster's own (``$CLUSTERJOB_SITE`` there, then
``~/.config/clusterjob/site.yaml``, then ``/etc/clusterjob/site.yaml``; else the known site
whose ``cluster_name`` is its Slurm ClusterName), fetched once and cached here for an hour.
"""

from __future__ import annotations

import base64
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from clusterjob import envvars
from clusterjob.errors import (
    ClusterjobError,
    SlurmError,
    SlurmUnavailable,
    UsageError,
    did_you_mean,
)
from clusterjob.jobs.private_files import check_own, read_own_file
from clusterjob.slurm import ssh
from clusterjob.slurm.runner import FILE_TIMEOUT, LocalTransport, SshTransport
from clusterjob.slurm.ssh import SshTarget

HOST_ENV = envvars.HOST
HOSTS_FILE = "hosts.yaml"
SITE_CACHE_SECONDS = 3600.0
DEFAULT_REMOTE_ROOT = "clusterjob"  # remote_dir default: ~/clusterjob/<local dir's name>

_PROFILE_KEYS = {
    "host", "user", "port", "identity", "remote_dir", "sync", "exclude", "python", "site",
    "ssh_options",
}  # fmt: skip


@dataclass(frozen=True)
class HostProfile:
    """Everything ``--host`` means: how to reach the login node and how jobs go there."""

    target: SshTarget
    remote_dir: str | None = None
    sync: bool = True
    exclude: tuple[str, ...] = ()
    python: str | None = None
    site: str | None = None


def hosts_file(environ: Mapping[str, str] | None = None) -> Path:
    from clusterjob.site.discovery import user_config_dir

    return user_config_dir(os.environ if environ is None else environ) / HOSTS_FILE


def host_profile(spec: str, environ: Mapping[str, str] | None = None) -> HostProfile:
    """``spec`` as a profile name in hosts.yaml, else as ``[USER@]HOST[:PORT]``."""
    spec = spec.strip()
    if not spec:
        raise UsageError("--host must not be empty")
    path = hosts_file(environ)
    profiles = load_profiles(path)
    if spec in profiles:
        return profiles[spec]
    target = ssh.parse_target(spec)
    return HostProfile(replace(target, note=_not_a_profile(spec, profiles, path)))


def _not_a_profile(spec: str, profiles: Mapping[str, HostProfile], path: Path) -> str:
    """What a failure to reach ``spec`` adds, for a profile name mistyped and so taken for a
    host name: that it is no profile of hosts.yaml, and the closest one."""
    if not profiles:
        return ""
    return (
        f"{spec} is not a profile of {path}{did_you_mean(spec, list(profiles))}; its profiles: "
        f"{', '.join(sorted(profiles))}"
    )


def load_profiles(path: Path) -> dict[str, HostProfile]:
    """The host profiles of ``path`` (none when it does not exist); a bad entry is one line
    naming the file and key."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UsageError(f"{path}: cannot read it ({exc.strerror})") from None
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        data = YAML(typ="safe", pure=True).load(text) or {}
    except YAMLError as exc:
        raise UsageError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    hosts = data.get("hosts") if isinstance(data, dict) else None
    if hosts is None:
        return {}
    if not isinstance(hosts, dict):
        raise UsageError(f"{path}: hosts: expected a mapping of profile names")
    return {str(name): _profile(path, str(name), entry) for name, entry in hosts.items()}


def _profile(path: Path, name: str, entry: object) -> HostProfile:
    where = f"{path}: hosts.{name}"
    if not isinstance(entry, dict):
        raise UsageError(f"{where}: expected a mapping with at least host:")
    unknown = sorted(set(map(str, entry)) - _PROFILE_KEYS)
    if unknown:
        raise UsageError(
            f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(_PROFILE_KEYS))})"
        )

    def text(key: str) -> str | None:
        value = entry.get(key)
        if value is None:
            return None
        if not isinstance(value, str | int) or isinstance(value, bool) or str(value) == "":
            raise UsageError(f"{where}.{key}: expected a non-empty string")
        return str(value)

    def words(key: str) -> tuple[str, ...]:
        value = entry.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{where}.{key}: expected a list of strings")
        return tuple(value)

    host = text("host")
    if host is None:
        raise UsageError(f"{where}.host: missing (the login node's name or ssh alias)")
    base = ssh.parse_target(host)
    port = text("port")
    if port is not None and not (port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"{where}.port: expected a port number, got {port!r}")
    sync = entry.get("sync", True)
    if not isinstance(sync, bool):
        raise UsageError(f"{where}.sync: expected true or false")
    target = replace(
        base,
        user=text("user") or base.user,
        port=int(port) if port is not None else base.port,
        identity=text("identity"),
        options=words("ssh_options"),
        name=name,
    )
    return HostProfile(
        target=target,
        remote_dir=text("remote_dir"),
        sync=sync,
        exclude=words("exclude"),
        python=text("python"),
        site=text("site"),
    )


# --- on the login node ------------------------------------------------------------------------


def remote_sh(transport: SshTransport, script: str, *args: str, timeout: float = 60) -> str:
    """Run a POSIX sh ``script`` on the login node ($1.. = ``args``); its stdout. A non-zero
    exit is a ``SlurmError`` with its stderr; ssh's own failures as for any command."""
    cmd = ["sh", "-c", script, "sh", *args]
    result = transport.exec(cmd, timeout, None)
    if result.returncode != 0:
        unreachable = ssh.SSH_LOST in result.stderr  # as Slurm out of reach: exit 4
        error = SlurmUnavailable if unreachable else SlurmError
        raise error(
            ["ssh" if unreachable else "sh"], result.returncode, result.stderr or result.stdout
        )
    return result.stdout


def default_remote_dir(local: Path) -> str:
    name = re.sub(r"[^A-Za-z0-9._-]", "_", local.resolve().name) or "work"
    return f"~/{DEFAULT_REMOTE_ROOT}/{name}"


_PREPARE = 'case "$1" in "~") d=$HOME ;; "~/"*) d=$HOME/${1#"~/"} ;; *) d=$1 ;; esac; '
_PREPARE += 'mkdir -p -- "$d" && cd -- "$d" && pwd -P'


def prepare_remote_dir(transport: SshTransport, path: str) -> str:
    """Create ``path`` on the login node (``~/`` is the remote home); its absolute form."""
    try:
        out = remote_sh(transport, _PREPARE, path)
    except SlurmUnavailable:
        raise  # the login node out of reach, not the directory
    except SlurmError as exc:
        raise UsageError(f"{transport.label}: cannot create {path}: {exc.stderr}") from None
    lines = out.strip().splitlines()
    if not lines or not lines[-1].startswith("/"):
        raise UsageError(f"{transport.label}: cannot find where {path} is")
    return lines[-1]


# read_own_file on the login node: the user's uid, each path's owner and raw mode (stat's %u
# %f; symlinks not followed but for the first), then the last one's bytes in base64 if it is a
# regular file; "missing" as soon as one does not exist (yet). check_own decides here, before
# anything is decoded or unpickled.
_READ_OWN = (
    'id -u || exit 4; f=-L; for p do if [ ! -e "$p" ] && [ ! -L "$p" ]; then echo missing; '
    'exit 0; fi; LC_ALL=C stat $f -c "%u %f" -- "$p" || exit 4; f=; done; echo --; '
    'if [ -f "$p" ] && [ ! -L "$p" ]; then base64 -- "$p"; fi'
)


def read_own_bytes(transport: LocalTransport, path: str, levels: int) -> bytes | None:
    """``path``'s bytes, here or on the login node, only if no one but the user could have
    written it or the ``levels`` directories above it (``private_files.check_own``); None
    when it does not exist (yet). Raises ClusterjobError naming what was refused."""
    if not isinstance(transport, SshTransport):
        return read_own_file(Path(path), levels)
    chain = [str(PurePosixPath(path).parents[i]) for i in reversed(range(levels))] + [path]
    try:
        out = remote_sh(transport, _READ_OWN, *chain, timeout=FILE_TIMEOUT)
    except SlurmUnavailable:
        raise  # the login node out of reach, not the file
    except SlurmError as exc:
        raise ClusterjobError(f"{transport.label}: cannot read {path}: {exc.stderr}") from None
    head, _, body = out.partition("--\n")
    me, *lines = head.splitlines() or [""]
    if lines and lines[-1] == "missing":
        return None
    try:  # an answer of another shape (a login shell's noise) is an error, not a guess
        uid = int(me)
        stats: list[tuple[str, int, int]] = []
        for where, line in zip(chain, lines, strict=True):
            uid_text, mode_text = line.split()
            stats.append((where, int(uid_text), int(mode_text, 16)))
        data = base64.b64decode(body)
    except ValueError:
        raise ClusterjobError(f"{transport.label}: cannot read {path}: {out[:200]!r}") from None
    for where, owner, st_mode in stats:
        check_own(f"{transport.label}:{where}", st_mode, owner, uid, directory=where != path)
    return data


def sync(profile: HostProfile, local: Path, remote_dir: str, *, warn: bool = True) -> None:
    """Copy ``local``'s contents into ``remote_dir`` with rsync over the shared connection
    (``.gitignore`` and the excludes honoured; nothing there is deleted). A tree over
    ``SIZE_WARNING_BYTES`` gets a warning on stderr first."""
    if warn:
        size = ssh.tree_size(local, profile.exclude)
        if size > ssh.SIZE_WARNING_BYTES:
            print(
                f"clusterjob: warning: syncing {size / 2**20:.0f} MiB from {local} to "
                f"{profile.target.label}:{remote_dir}; add `exclude:` patterns to the host "
                "profile for data and checkpoints",
                file=sys.stderr,
            )
    argv = ssh.rsync_argv(profile.target, local, remote_dir, profile.exclude)
    ssh.run_rsync(argv, profile.target)


_WHICH_PYTHON = "command -v python3 || command -v python"


def remote_python(transport: SshTransport) -> str | None:
    """``python3`` (else ``python``) on the login node's PATH, absolute; None if neither."""
    try:
        out = remote_sh(transport, _WHICH_PYTHON).strip()
    except SlurmUnavailable:
        raise  # the login node out of reach: not "no python there"
    except SlurmError:
        return None
    return out.splitlines()[-1] if out.startswith("/") else None


# The cluster's own site file, in the documented order of its login node (paths only).
_FIND_SITE = (
    'for f in "${CLUSTERJOB_SITE:-}" "${XDG_CONFIG_HOME:-$HOME/.config}/clusterjob/site.yaml" '
    "/etc/clusterjob/site.yaml; do "
    'case "$f" in */*|*.yaml|*.yml) if [ -f "$f" ]; then printf "%s\\n" "$f"; '
    'exec cat -- "$f"; fi ;; esac; done; exit 3'
)


def cache_dir(environ: Mapping[str, str] | None = None) -> Path:
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "clusterjob" / "hosts"


def remote_site_file(
    transport: SshTransport, cluster_name: object, *, refresh: bool = False
) -> Path:
    """A local copy of the cluster's site config (fetched, then reused for an hour); for a
    cluster without one, the known site (here) whose cluster_name is its ClusterName."""
    from clusterjob.site.discovery import declared_cluster_name, known_site_files

    directory = cache_dir() / transport.target.key()
    cached = directory / "site.yaml"
    try:
        fresh = time.time() - cached.stat().st_mtime < SITE_CACHE_SECONDS
    except OSError:
        fresh = False
    if fresh and not refresh:
        return cached
    try:
        out = remote_sh(transport, _FIND_SITE)
    except SlurmError as exc:
        if exc.returncode != 3:
            if cached.is_file():
                return cached  # the login node did not answer: the last copy will do
            raise
        out = ""
    if out:
        where, _, text = out.partition("\n")
        directory.mkdir(parents=True, exist_ok=True)
        header = f"# fetched from {transport.label}:{where} by clusterjob\n"
        tmp = directory / f".site.{os.getpid()}.tmp"
        tmp.write_text(header + text)
        os.replace(tmp, cached)
        return cached
    assert callable(cluster_name)
    name = cluster_name()
    for path in known_site_files(os.environ):
        if declared_cluster_name(path) == name:
            return path
    raise UsageError(
        f"{transport.label} has no site config ($CLUSTERJOB_SITE, ~/.config/clusterjob/"
        f"site.yaml, /etc/clusterjob/site.yaml there) and no known site has cluster_name "
        f"{name}; pass --site NAME|FILE (a site config here) or `site:` in the host profile"
    )
