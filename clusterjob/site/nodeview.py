"""One node's slice of a site config, for the Prolog: answered from a small JSON cache.

The Prolog runs before every job on every node, so its cost is paid thousands of times
a day. On a cache hit this module uses the standard library only (no ruamel, no hostlist):
one ``fstat`` of the open site file, one small JSON read. The cache entry is keyed by the
site file's (realpath, device, inode, mtime_ns, size) and the node name, so editing the site
file invalidates it. On a miss the compiled node map beside the site file answers when it
was built from the very text opened (``site validate --compile``: every node's entry, for
large sites), else the full loader validates the file; the entry is then rewritten
atomically. The cache directory must be writable only by the Prolog's user (root): an
entry not owned by us, or writable by others, is ignored.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path

from clusterjob.gpu.models import model_for_nvml_name
from clusterjob.record import Record
from clusterjob.site.nodemodel import CheckPolicy, NodeGpu, OnError, PrologPolicy

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:  # not at run time: the Prolog imports this module before every job
    from typing import Any

    from clusterjob.site.model import Site  # the submission side's model: not on a cache hit

CACHE_FORMAT = 7  # 3: a slot's nvlinks; 4: check policies; 5: a slot's MIG; 6: cuda_min;
# 7: the GPU instance ids of its MIG slices


class NodeView(Record):
    """What the node side needs: this node's GPU slots, and how to recognise each model."""

    __slots__ = (
        "site",
        "source",
        "node",
        "gpus",
        "models",
        "gres_types",
        "prolog",
        "checks",
        "partition_checks",
    )

    site: str
    source: Path  # the site file as named by the caller
    node: str
    gpus: tuple[NodeGpu, ...] | None  # None: the node is not in the site's node map
    models: Mapping[str, tuple[str, ...]]  # canonical model name -> its NVML names
    gres_types: Mapping[str, str | None]  # canonical model name -> GRES type (None: untyped)
    prolog: PrologPolicy
    checks: CheckPolicy  # the site's
    partition_checks: Mapping[str, CheckPolicy]  # this node's

    def __init__(
        self,
        site: str,
        source: Path,
        node: str,
        gpus: tuple[NodeGpu, ...] | None,
        models: Mapping[str, tuple[str, ...]],
        gres_types: Mapping[str, str | None],
        prolog: PrologPolicy,
        checks: CheckPolicy | None = None,
        partition_checks: Mapping[str, CheckPolicy] | None = None,
    ) -> None:
        self._fill(
            site,
            source,
            node,
            gpus,
            models,
            gres_types,
            prolog,
            CheckPolicy() if checks is None else checks,
            {} if partition_checks is None else partition_checks,
        )

    def checks_for(self, partition: str | None) -> CheckPolicy:
        """The check policy for a job of ``partition`` (Slurm may give a list: the first)."""
        name = (partition or "").split(",")[0]
        own = self.partition_checks.get(name)
        return self.checks.under(own) if own is not None else self.checks

    def model_for_nvml_name(self, nvml_name: str) -> str | None:
        """The canonical model an NVML device name belongs to (case-insensitive)."""
        return model_for_nvml_name(nvml_name, self.models)


def view_from_site(site: Site, node: str, source: Path | None = None) -> NodeView:
    """The node's slice of an already loaded site."""
    return NodeView(
        site=site.name,
        source=source if source is not None else site.source,
        node=node,
        gpus=site.node_map.gpus(node),
        models={m.name: m.nvml_names for m in site.models},
        gres_types={m.name: m.gres_type for m in site.models},
        prolog=site.prolog,
        checks=site.checks,
        partition_checks={
            p.name: p.checks
            for p in site.partitions
            if node in p.node_names and p.checks != CheckPolicy()
        },
    )


def _config_error(path: Path, exc: OSError) -> Exception:
    from clusterjob.errors import ConfigError, ConfigIssue

    return ConfigError(ConfigIssue(str(path), None, "", f"cannot read: {exc.strerror or exc}"))


def _cache_file(cache_dir: Path, realpath: str, node: str) -> Path:
    """One file per (site file, node); the key inside decides whether it is still valid."""
    plain = node.replace("-", "").replace("_", "").replace(".", "")
    shown = node if node.isascii() and plain.isalnum() and len(node) <= 64 else "node"
    digest = zlib.crc32(f"{realpath}\0{node}".encode()) & 0xFFFFFFFF
    return cache_dir / f"{shown}.{digest:08x}.json"


def _to_json(view: NodeView, key: list[Any]) -> str:
    return json.dumps(
        {"format": CACHE_FORMAT, "key": key, **_view_dict(view)}, separators=(",", ":")
    )


def _view_dict(view: NodeView) -> dict[str, Any]:
    return {
        "node": view.node,
        "site": view.site,
        "gpus": None if view.gpus is None else [_slot_json(g) for g in view.gpus],
        "models": {k: list(v) for k, v in view.models.items()},
        "gres_types": dict(view.gres_types),
        "prolog": {
            "on_error": view.prolog.on_error.value,
            "deadline_seconds": view.prolog.deadline_seconds,
            "log_path": view.prolog.log_path,
        },
        "checks": _policy_json(view.checks),
        "partition_checks": {k: _policy_json(v) for k, v in view.partition_checks.items()},
    }


def _slot_json(g: NodeGpu) -> list[Any]:
    return [g.slot, g.model, g.bus_id, g.uuid, g.nvlinks, g.mig, g.mig_gi]


def _slot(
    slot: int,
    model: str,
    bus_id: str | None,
    uuid: str | None,
    nvlinks: int | None,
    mig: Any,
    mig_gi: Any,
) -> NodeGpu:
    return NodeGpu(
        slot,
        model,
        bus_id,
        uuid,
        nvlinks,
        None if mig is None else tuple(mig),
        None if mig_gi is None else tuple(mig_gi),
    )


def _policy_json(policy: CheckPolicy) -> list[Any]:
    return [policy.driver_min, dict(policy.severity), policy.cuda_min]


def _policy(data: list[Any]) -> CheckPolicy:
    driver_min, severity, cuda_min = data
    return CheckPolicy(driver_min, {str(k): str(v) for k, v in severity.items()}, cuda_min)


def _from_json(data: dict[str, Any], source: Path) -> NodeView:
    prolog = data["prolog"]
    gpus = data["gpus"]
    return NodeView(
        site=data["site"],
        source=source,
        node=data["node"],
        gpus=None if gpus is None else tuple(_slot(*g) for g in gpus),
        models={k: tuple(v) for k, v in data["models"].items()},
        gres_types=dict(data["gres_types"]),
        prolog=PrologPolicy(
            on_error=OnError(prolog["on_error"]),
            deadline_seconds=float(prolog["deadline_seconds"]),
            log_path=prolog["log_path"],
        ),
        checks=_policy(data["checks"]),
        partition_checks={k: _policy(v) for k, v in data["partition_checks"].items()},
    )


# -- the compiled node map: every node's view, beside the site file ---------------------------

COMPILED_SUFFIX = ".nodes.json"  # site.yaml -> site.yaml.nodes.json


def compiled_path(site_file: Path) -> Path:
    return site_file.with_name(site_file.name + COMPILED_SUFFIX)


COMPILED_FORMAT = 2  # 2: a header line, then one sorted line per node (1: one JSON object)
_SHARED = ("site", "models", "gres_types", "prolog", "checks")  # the same in every node's view
COMPILED_HEADER_MAX = 1 << 20  # the longest header line read
MAX_COMPILED_SITE = 64 << 20  # a larger site file is read as YAML, its compiled map unread
_BLOCK = 4096


def compile_node_views(site: Site, text: bytes) -> str:
    """Every node's view of ``site`` (whose file holds ``text``), for the Prolog's first run
    on a node: ``clusterjob site validate --compile`` writes it beside the site file. A node
    in no entry gets the ``absent`` view. Valid only for the very text it was built from.

    A header line (the site-wide parts of every view, the absent node's, the site text's
    sha256), then one ``NODE<TAB>JSON`` line per node sorted by name: the Prolog finds its
    node's line by a binary search of a few reads, not by parsing every node's (a 10,000-node
    map is ~4 MB; parsing it all took 0.2-0.4 s of the node's first Prolog)."""
    import hashlib  # not on the Prolog's warm path

    named = set(site.node_map.nodes)
    for partition in site.partitions:
        named.update(partition.node_names)
    absent = _view_dict(view_from_site(site, "\0"))
    header = {
        "compiled": COMPILED_FORMAT,
        "format": CACHE_FORMAT,
        "sha256": hashlib.sha256(text).hexdigest(),
        "shared": {k: absent[k] for k in _SHARED},
        "absent": {k: v for k, v in absent.items() if k not in _SHARED and k != "node"},
    }
    lines = [json.dumps(header, separators=(",", ":"))]
    for name in sorted(named, key=lambda n: n.encode()):
        if "\t" in name or "\n" in name:  # not a Slurm node name; the YAML answers for it
            continue
        view = _view_dict(view_from_site(site, name))
        own = {k: v for k, v in view.items() if k not in _SHARED and k != "node"}
        lines.append(f"{name}\t{json.dumps(own, separators=(',', ':'))}")
    return "\n".join(lines) + "\n"


def compiled_map_note(site_file: Path, problem: str) -> str:
    """What to tell an admin whose compiled node map cannot answer (``problem``)."""
    return (
        f"compiled node map {compiled_path(site_file)} not used ({problem}): the YAML was "
        f"read instead; run `clusterjob site validate --compile {site_file}` after each edit"
    )


def compiled_nodes(text: str) -> list[str]:
    """The node names a compiled node map has a line for, in its order."""
    return [line.split("\t", 1)[0] for line in text.splitlines()[1:]]


def _line_at(fd: int, pos: int, end: int, limit: int = COMPILED_HEADER_MAX) -> bytes:
    """The line starting at byte ``pos`` (without its newline), reading at most to ``end``."""
    chunks = []
    size = 0
    while pos < end and size < limit:
        chunk = os.pread(fd, min(_BLOCK, end - pos), pos)
        if not chunk:
            break
        cut = chunk.find(b"\n")
        if cut >= 0:
            chunks.append(chunk[:cut])
            break
        chunks.append(chunk)
        pos += len(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _next_line_start(fd: int, pos: int, end: int) -> int:
    """The first line start after byte ``pos`` (``end`` when none)."""
    while pos < end:
        chunk = os.pread(fd, min(_BLOCK, end - pos), pos)
        if not chunk:
            return end
        cut = chunk.find(b"\n")
        if cut >= 0:
            return pos + cut + 1
        pos += len(chunk)
    return end


def find_sorted_line(fd: int, start: int, end: int, key: bytes) -> bytes | None:
    """The rest of the line ``KEY<TAB>...`` among the lines in bytes ``start``..``end`` of
    ``fd``, sorted by key (bytewise), or None: a binary search by byte offset, so a few
    ``pread`` calls whatever the number of lines (``look(1)``'s way)."""
    lo, hi = start, end  # lo: a line start, every line before it is < key; hi: line start
    while hi - lo > _BLOCK:
        mid = _next_line_start(fd, (lo + hi) // 2, hi)
        if mid >= hi:
            break
        name = _line_at(fd, mid, hi).split(b"\t", 1)[0]
        if name < key:
            lo = mid
        else:
            hi = mid
    # the key's line starts in lo..hi: read that stretch at once, then the line at hi
    block = os.pread(fd, hi - lo, lo) if hi > lo else b""
    for line in [*block.split(b"\n")[: block.count(b"\n")], _line_at(fd, hi, end)]:
        name, tab, rest = line.partition(b"\t")
        if name == key and tab:
            return rest
        if name > key:
            return None
    return None


def compiled_map_problem(header: bytes, site_text: bytes) -> str | None:
    """Why a compiled node map whose first line is ``header`` cannot answer for the site file
    holding ``site_text`` (it is then ignored and the YAML read); None when it can."""
    return _header_problem(_parsed_header(header), site_text)


def _parsed_header(header: bytes) -> dict[str, Any] | None:
    """A compiled map's header line as JSON; None when it is none."""
    try:
        fields = json.loads(header)
    except ValueError:
        return None
    return fields if isinstance(fields, dict) else None


def _header_problem(fields: dict[str, Any] | None, site_text: bytes) -> str | None:
    import hashlib  # not on the Prolog's warm path

    if fields is None:
        return "not a compiled node map"
    if (fields.get("compiled"), fields.get("format")) != (COMPILED_FORMAT, CACHE_FORMAT):
        return "written by another clusterjob version"
    if fields.get("sha256") != hashlib.sha256(site_text).hexdigest():
        return "built from another version of the site file"
    return None


def _read_compiled(
    fd: int, site_fd: int, node: str, source: Path
) -> tuple[NodeView | None, str | None]:
    """This node's view from the compiled file open on ``fd`` when it was built from the
    site text open on ``site_fd``; else no view (the loader then reads the YAML) and why not
    (None for a node name no line can hold).

    Reads the header and this node's line only; hashing the site text (~2 ms per 3 MB) is
    what still grows with the site."""
    if "\t" in node or "\n" in node:
        return None, None  # no line can name it
    try:
        size = os.fstat(site_fd).st_size
        if size > MAX_COMPILED_SITE:
            return None, f"the site file is over {MAX_COMPILED_SITE >> 20} MiB"
        end = os.fstat(fd).st_size
        head = _line_at(fd, 0, end)
        header = _parsed_header(head)  # parsed once: checked, then read
        problem = _header_problem(header, os.pread(site_fd, size + 1, 0))
        if problem is not None or header is None:
            return None, problem
        line = find_sorted_line(fd, len(head) + 1, end, node.encode())
        own = header["absent"] if line is None else json.loads(line)
        return _from_json({**header["shared"], **own, "node": node}, source), None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        return None, f"unreadable ({type(exc).__name__})"  # torn or foreign: read the YAML


def _read_cache(
    name: str, key: list[Any], node: str, source: Path, dir_fd: int, owners: set[int]
) -> NodeView | None:
    """The entry ``name`` when it is the cache's answer for ``key``: a plain file, written by
    one of ``owners`` and by no one else; a miss otherwise."""
    try:
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
            return None  # a FIFO, device or hard link planted here: not ours
        if st.st_uid not in owners or st.st_mode & 0o022:
            return None  # not written by whom we trust: do not use it
        data = json.loads(os.read(fd, 1 << 20))
        if data.get("format") != CACHE_FORMAT or data.get("key") != key:
            return None
        if data.get("node") != node:
            return None
        return _from_json(data, source)
    except (OSError, ValueError, KeyError, TypeError):
        return None  # a torn or foreign file is a miss, never an error
    finally:
        os.close(fd)


def _write_cache(name: str, text: str, dir_fd: int) -> None:
    """Write atomically (temporary file + rename) so a reader never sees half an entry."""
    tmp = f".{name}.{os.getpid()}.tmp"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            os.fchmod(fd, 0o644)
            fh.write(text)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError:  # an unwritable cache only costs speed
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)


def load_node_view(
    path: Path,
    node: str,
    cache_dir: Path | None = None,
    *,
    hooks_cache_dir: Path | str | None = None,
) -> NodeView:
    """This node's view of the site in ``path``, read by name (a user's process: the in-job
    preflight, the TaskProlog, Grid Engine's GPU binding). While the file is unchanged it
    comes from the cache in ``cache_dir`` (read and written; None: none) or from the hooks'
    per-node cache in ``hooks_cache_dir`` (only read here; the Prolog filled this node's
    entry before the job, so root's entries are taken as well as ours); else from the
    compiled node map beside the file when it was built from this very text; else from the
    YAML. A job on a node its Prolog checked, or on a compiled site, so reads one small entry
    whatever the site's size.

    Raises ConfigError when the file cannot be read or is not a valid site config. The root
    Prolog uses ``load_node_view_fd`` instead: it never reads a path by name.
    """
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise _config_error(path, exc) from None
    opened: list[int] = []
    try:
        cache_fd = hooks_fd = None
        if cache_dir is not None:
            with contextlib.suppress(OSError):
                Path(cache_dir).mkdir(mode=0o755, parents=True, exist_ok=True)
            cache_fd = _open_quietly(cache_dir, os.O_DIRECTORY, opened)
        if hooks_cache_dir is not None:
            hooks_fd = _open_quietly(hooks_cache_dir, os.O_DIRECTORY, opened)
        return load_node_view_fd(
            fd,
            os.path.realpath(path),
            path,
            node,
            cache_fd,
            lambda: _open_quietly(compiled_path(path), os.O_NONBLOCK),  # never a FIFO's wait
            hooks_cache_fd=hooks_fd,
        )
    finally:
        for other in opened:
            os.close(other)
        os.close(fd)


def _open_quietly(path: Path | str, flags: int, opened: list[int] | None = None) -> int | None:
    """``path`` opened read-only (added to ``opened``), or None where it cannot be: each
    place it answers from is only a shortcut."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    except OSError:
        return None
    if opened is not None:
        opened.append(fd)
    return fd


def load_node_view_fd(
    fd: int,
    realpath: str,
    path: Path,
    node: str,
    cache_dir_fd: int | None,
    open_compiled: Callable[[], int | None] | None = None,
    notes: list[str] | None = None,
    *,
    hooks_cache_fd: int | None = None,
) -> NodeView:
    """This node's view of the site open on ``fd``; the cache is the directory on
    ``cache_dir_fd`` (None: no cache); on a miss, the compiled node map ``open_compiled``
    opens (the caller checks it as it checked the site file; None: there is none) answers
    if it was built from this very text, else the YAML is read. A compiled map there that
    could not answer is said in ``notes``: each node's first job after an edit then parses
    the YAML (seconds on a large site) until it is compiled again.

    ``hooks_cache_fd``: the hooks' cache, only read, its entries root's or ours.

    The cache key is the open file's identity (device, inode, size, mtime) and ``realpath``,
    so an entry can only answer for the very file the caller opened and checked.
    """
    try:
        st = os.fstat(fd)
    except OSError as exc:
        raise _config_error(path, exc) from None
    key: list[Any] = [realpath, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size]
    name = _cache_file(Path("."), realpath, node).name
    ours = os.geteuid()
    for dir_fd, owners in ((cache_dir_fd, {ours}), (hooks_cache_fd, {ours, 0})):
        if dir_fd is not None:
            hit = _read_cache(name, key, node, path, dir_fd, owners)
            if hit is not None:
                return hit
    view = None
    compiled_fd = open_compiled() if open_compiled is not None else None
    if compiled_fd is not None:
        try:
            view, problem = _read_compiled(compiled_fd, fd, node, path)
        finally:
            os.close(compiled_fd)
        if problem is not None and notes is not None:
            notes.append(compiled_map_note(path, problem))
    if view is None:
        from clusterjob.site.loader import load_site  # the slow path: ruamel, hostlist

        view = view_from_site(load_site(path, fd), node, source=path)
    if cache_dir_fd is not None and os.fstat(fd).st_mtime_ns == st.st_mtime_ns:
        _write_cache(name, _to_json(view, key), cache_dir_fd)
    return view
