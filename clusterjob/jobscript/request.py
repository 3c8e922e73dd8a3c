"""What the user asked for (``JobRequest``), and what it means at one site (``ResolvedJob``).

``resolve`` is pure: it reads the site's models, partitions and node map and either returns
the GPU request in the site's own sbatch syntax or raises a ``UsageError`` that says what
this site can do instead. Nothing here talks to Slurm.
"""

from __future__ import annotations

import itertools
import json
import os
import posixpath
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import NamedTuple

import hostlist

from clusterjob.errors import ConfigError, ConfigIssue, UsageError, did_you_mean
from clusterjob.jobscript import directives
from clusterjob.jobscript import interpreter as interpreters
from clusterjob.jobscript.interpreter import Interpreter, SubmitPython
from clusterjob.jobscript.program import PYTHON_COMMANDS, snapshot_word
from clusterjob.jobscript.requeues import DEFAULT_MAX_REQUEUES, check_max_requeues
from clusterjob.jobscript.shell import check_directive_value, check_no_nul
from clusterjob.site import pinning
from clusterjob.site.model import GpuModel, JobDefaults, Partition, Site, group_model
from clusterjob.slurm.syntax import MEMORY_SIZE, array_task_ids, time_seconds

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")  # as clusterjob.slurm finds it in --comment


def new_token() -> str:
    """A submission token, written into ``--comment`` so a job whose sbatch timed out can be
    found again (squeue/sacct) instead of being submitted twice. What ``secrets.token_hex(8)``
    returns (the same ``os.urandom``), without importing ``secrets`` (its ``random`` and
    ``hmac``) on every submit."""
    return os.urandom(8).hex()


@dataclass(frozen=True)
class JobRequest:
    """A job as the user asked for it, before any site knowledge is applied."""

    script: str
    args: tuple[str, ...] = ()
    gpus: int = 1  # per node
    model: str | None = None  # None: the site's only model
    nodes: int = 1
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None
    job_name: str | None = None
    array: str | None = None
    dependency: str | None = None
    output: str | None = None
    error: str | None = None
    signal: str | None = None  # e.g. "B:USR1@90": warn the batch shell before the time limit
    requeue: bool = False
    exclude: str | None = None
    nodelist: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    constraint: str | None = None
    sbatch_args: tuple[str, ...] = ()  # passed through as #SBATCH lines, e.g. "--exclusive"
    # None: not asked for: one task per node, or one per GPU where the site's jobs run one
    # task per GPU (gpus-per-task syntax, cpus-per-task form); torchrun spawns its workers
    tasks_per_node: int | None = None
    token: str = field(default_factory=new_token)
    # --sweep / --params: array task i gets task_args[i] appended to args (one array job)
    task_args: tuple[tuple[str, ...], ...] = ()
    # The job's interpreter (clusterjob.jobscript.interpreter). --python / --venv / --conda as
    # given; once resolved, the choice made and why (the registry keeps it: resubmit reuses it).
    python: str | None = None
    venv: str | None = None
    conda: str | None = None
    python_why: str | None = None
    submit_python: str | None = None  # python3 on the submitting PATH, absolute
    active_env: str | None = None  # the venv or conda env active at submit ($VIRTUAL_ENV...)
    command: bool = False  # True: run script + args as given (clusterjob.jobscript.program)
    launcher: str | None = None  # torchrun | srun | none; None: chosen from nodes and tasks
    launcher_args: tuple[str, ...] = ()  # the user's own torchrun or srun options
    setup: tuple[str, ...] = ()  # --setup: shell lines run before the program, verbatim
    modules: tuple[str, ...] = ()  # --module: `module load NAME`, in order
    env: tuple[str, ...] = ()  # --env KEY=VALUE, exported (the value quoted)
    container_image: str | None = None  # pyxis: the program's srun step runs in this image
    container_mounts: str | None = None  # pyxis --container-mounts, passed through
    apptainer: str | None = None  # the program runs under `apptainer exec --nv IMAGE`
    gres: tuple[str, ...] = ()  # --gres: extra GRES (nvme:10), merged into the one --gres
    project: str | None = None  # --project: fills {project} in the site's account pattern
    max_requeues: int | None = None  # None: the site's defaults.max_requeues, else 3
    # --snapshot: the copy of the job's code taken at submit (absolute, or relative to the
    # job's directory); the program file and PYTHONPATH point there (jobs/snapshot.py)
    snapshot: str | None = None
    # --retry-bad-node N: the side that waits for the job submits it again without a node its
    # preflight, a node failure or a GPU fault named, at most N times (jobs/badnodes.py)
    retry_bad_node: int = 0


@dataclass(frozen=True)
class GresRequest:
    """The GPU request in one site's syntax: the exact sbatch options to write."""

    options: tuple[str, ...]  # e.g. ("--gres=gpu:a100:2",) or ("--gres=gpu:2", "--constraint=a100")
    per_node: int
    nodes: int
    gres_type: str | None  # the type written in the request, None when untyped


@dataclass(frozen=True)
class ResolvedJob:
    """A request made concrete for one site: model, partition, GPU options, defaults applied."""

    request: JobRequest
    site_name: str
    model: GpuModel | None  # None: a CPU-only job (--gpus 0)
    partition: Partition
    gres: GresRequest
    nodes: int
    gpus_per_node: int
    tasks_per_node: int
    job_name: str
    account: str | None
    qos: str | None
    cpus_per_gpu: int | None
    mem_per_gpu: str | None
    time: str | None
    constraint: str | None  # the user's constraint when the GPU options do not carry it
    eligible_nodes: tuple[str, ...]  # nodes of the partition with enough GPUs of the model
    token: str
    notes: tuple[str, ...] = ()  # what resolve changed in the request, one line each
    interpreter: Interpreter | None = None  # None: nothing chose one (render falls back)
    runs_python: bool = True  # the program is "$python" followed by argv
    launcher: str = "none"  # what starts the program: torchrun | srun | none (LAUNCHERS)
    env: tuple[tuple[str, str], ...] = ()  # --env as (KEY, VALUE)
    argv: tuple[str, ...] = ()  # the program's words (after "$python" when runs_python)
    partition_option: bool = True  # write --partition (False: the site routes, or by QoS)
    sbatch_args: tuple[str, ...] = ()  # extra #SBATCH options: the site's, then the user's
    sbatch_tasks_per_node: int | None = None  # #SBATCH --ntasks-per-node (None: tasks_per_node)
    cpus_per_task: int | None = None  # written instead of --cpus-per-gpu (cpus-per-task form)
    mem: str | None = None  # --mem per node, written instead of --mem-per-gpu (mem form)
    preflight: str = "required"  # required | warn | off
    max_requeues: int = DEFAULT_MAX_REQUEUES  # an attempt past it stops (jobscript.requeues)


# --- node map queries -------------------------------------------------------------------


def _model_count(site: Site, node: str, model: str) -> int:
    found = site.gres_models(node)  # a MIG slice counts for its slice model
    return sum(found.count(m) for m in site.members(model))  # a group: any of its models


def _nodes_with_model(site: Site, model: str, among: tuple[str, ...] | None = None) -> list[str]:
    names = among if among is not None else tuple(site.node_map.nodes)
    return [n for n in names if _model_count(site, n, model) > 0]


def _compress(nodes: list[str]) -> str:
    return str(hostlist.collect_hostlist(nodes))


def _capacity_text(site: Site, partition: Partition, model: str) -> str:
    """``V100: at most 2 per node (nodes gpu-v[01-04])``, smaller groups after the largest."""
    by_count: dict[int, list[str]] = {}
    for node in partition.node_names:
        count = _model_count(site, node, model)
        if count:
            by_count.setdefault(count, []).append(node)
    parts = [
        f"{count} per node (nodes {_compress(nodes)})"
        for count, nodes in sorted(by_count.items(), reverse=True)
    ]
    return f"{model}: at most " + ", ".join(parts)


def _models_in(site: Site, partition: Partition) -> list[str]:
    return [m.name for m in site.models if _nodes_with_model(site, m.name, partition.node_names)]


# --- validation helpers -----------------------------------------------------------------


def _check_text_fields(request: JobRequest) -> None:
    """Refuse values that cannot be written into the script, before anything else."""
    _check_directive_values(request)
    _check_words(request)
    _check_counts(request)


_DIRECTIVE_FIELDS = (
    "partition", "time", "account", "qos", "mem_per_gpu", "job_name", "array", "dependency",
    "output", "error", "signal", "exclude", "nodelist", "mail_type", "mail_user", "constraint",
)  # fmt: skip


def _check_directive_values(request: JobRequest) -> None:
    """The options written as ``#SBATCH`` lines: one line each, not empty; --sbatch-arg an
    option; --mem-per-gpu a Slurm memory size."""
    for name in _DIRECTIVE_FIELDS:
        value = getattr(request, name)
        if value is not None:
            if value == "":
                raise UsageError(f"--{name.replace('_', '-')} must not be empty")
            check_directive_value(value, f"--{name.replace('_', '-')}")
    if request.mem_per_gpu is not None and not MEMORY_SIZE.match(request.mem_per_gpu):
        raise UsageError(
            f"--mem-per-gpu {request.mem_per_gpu!r} is not a Slurm memory size (e.g. 64G, 500M)"
        )
    for arg in request.sbatch_args:
        check_directive_value(arg, "--sbatch-arg")
        if not arg.startswith("-"):
            raise UsageError(
                f"--sbatch-arg {arg!r} is not an sbatch option (expected --name=value)"
            )


def _check_words(request: JobRequest) -> None:
    """The script, its arguments and each sweep task's: no NUL byte; a script named; the
    submission token as clusterjob makes them."""
    check_no_nul(request.script, "the script path")
    if not request.script:
        raise UsageError("no script given")
    for arg in request.args:
        check_no_nul(arg, "a job argument")
    for task in request.task_args:
        for arg in task:
            check_no_nul(arg, "a sweep argument")
    if not _TOKEN.fullmatch(request.token):
        raise UsageError(f"bad submission token {request.token!r}")


def _check_counts(request: JobRequest) -> None:
    """Nodes, tasks and CPUs at least 1; GPUs 0 or more, and no per-GPU option without."""
    for name in ("nodes", "tasks_per_node"):
        value = getattr(request, name)
        if value is not None and value < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1")
    if request.gpus < 0:
        raise UsageError("--gpus must be 0 (a CPU-only job) or more")
    if request.gpus == 0:
        for given, option in (
            (request.model, "--model"),
            (request.cpus_per_gpu, "--cpus-per-gpu"),
            (request.mem_per_gpu, "--mem-per-gpu"),
        ):
            if given is not None:
                raise UsageError(
                    f"{option} asks for GPUs, but this is a CPU-only job (--gpus 0 or none): "
                    "give --gpus N"
                )
    if request.cpus_per_gpu is not None and request.cpus_per_gpu < 1:
        raise UsageError("--cpus-per-gpu must be at least 1")


# --- resolution -------------------------------------------------------------------------


def _find_model(site: Site, request: JobRequest) -> GpuModel:
    if request.model is None:
        if len(site.models) == 1:
            return site.models[0]
        implied = _partition_model(site, request.partition)
        if implied is not None:
            return implied
        raise UsageError(
            f"--model is required at site {site.name}; this site has: {_model_list(site)}"
        )
    model = site.model(request.model)
    group = site.group(request.model) if model is None else None
    if group is not None:
        return group_model(group, [site.model_by_name(m) for m in group.models])
    if model is None:
        raise UsageError(
            f"unknown GPU model {request.model!r} at site {site.name}"
            f"{did_you_mean(request.model, _model_spellings(site))}; "
            f"this site has: {_model_list(site)}"
        )
    return model


def _model_spellings(site: Site) -> dict[str, str]:
    """Every name ``--model`` takes (names, aliases, groups) -> the model's own name."""
    named = [(m.name, m.aliases) for m in site.models]
    named += [(g.name, g.aliases) for g in site.model_groups]
    return {spelling: name for name, aliases in named for spelling in (name, *aliases)}


def _check_node_names(site: Site, request: JobRequest) -> None:
    """--nodelist and --exclude name only nodes this site has: an unknown one is named as
    such (and the closest node), not taken for a node without the GPUs asked for."""
    known = {n for p in site.partitions for n in p.node_names} | set(site.node_map.nodes)
    if not known:
        return
    for option, hosts in (("--nodelist", request.nodelist), ("--exclude", request.exclude)):
        unknown = sorted(_expand(hosts, option) - known)
        if unknown:
            raise UsageError(
                f"{option}: no node {_compress(unknown)} at site {site.name}"
                f"{did_you_mean(unknown[0], sorted(known))}; its nodes: "
                f"{_compress(sorted(known))}"
            )


def _partition_model(site: Site, name: str | None) -> GpuModel | None:
    """The one model the job's partition holds (the one named, else the default), which
    ``--model`` may then leave out (``-p test`` where the test partition has only V100s);
    None where it holds several."""
    if name is not None:
        partition = site.partition(name)
    else:
        partition = next((p for p in site.partitions if p.default), None)
    return site.sole_model(partition) if partition is not None else None


def _model_list(site: Site) -> str:
    return ", ".join(
        f"{m.name} ({len(_nodes_with_model(site, m.name))} nodes)" for m in site.models
    )


def _expand(hosts: str | None, option: str) -> set[str]:
    if not hosts:
        return set()
    try:
        return set(hostlist.expand_hostlist(hosts))
    except hostlist.BadHostlist as exc:
        raise UsageError(f"{option}: not a Slurm hostlist: {hosts!r} ({exc})") from None


def _fits(site: Site, partition: Partition, model: str, request: JobRequest) -> list[str]:
    """Nodes of ``partition`` that can each give ``request.gpus`` GPUs of ``model`` (honouring
    --exclude and --nodelist); empty when the request does not fit there."""
    excluded = _expand(request.exclude, "--exclude")
    eligible = [
        n
        for n in partition.node_names
        if n not in excluded and _model_count(site, n, model) >= request.gpus
    ]
    required = _expand(request.nodelist, "--nodelist")
    if not required <= set(eligible):
        return []
    return eligible if len(eligible) >= request.nodes else []


def _named_partition(site: Site, name: str) -> Partition:
    """The partition ``--partition`` names; a one-line error listing the valid ones."""
    partition = site.partition(name)
    if partition is None:
        valid = ", ".join(p.name for p in site.partitions)
        raise UsageError(
            f"unknown partition {name!r} at site {site.name}"
            f"{did_you_mean(name, [p.name for p in site.partitions])}; valid partitions: {valid}"
        )
    return partition


def _cpu_partition(site: Site, request: JobRequest) -> tuple[Partition, list[str]]:
    """A CPU-only job's partition: the one named, else the default, else the first; its
    nodes outside --exclude (Slurm places the job, the node map has no say)."""
    if request.partition is not None:
        partition = _named_partition(site, request.partition)
    else:
        ordered = sorted(site.partitions, key=lambda p: not p.default)
        if not ordered:
            raise UsageError(f"site {site.name} has no partitions for a CPU-only job")
        partition = ordered[0]
    excluded = _expand(request.exclude, "--exclude")
    eligible = [n for n in partition.node_names if n not in excluded]
    if len(eligible) < request.nodes:
        raise UsageError(
            f"cannot give {request.nodes} node(s) in partition {partition.name} at site "
            f"{site.name}: it has {len(eligible)}"
        )
    return partition, eligible


def _choose_partition(
    site: Site, model: GpuModel, request: JobRequest
) -> tuple[Partition, list[str]]:
    """Explicit partition, else the default one that has the model, else the first that has it.

    Among partitions that have the model, one where the request fits is preferred, so that a
    small default partition does not hide a bigger one.
    """
    if request.partition is not None:
        partition = _named_partition(site, request.partition)
        if not _nodes_with_model(site, model.name, partition.node_names):
            here = ", ".join(_models_in(site, partition)) or "no GPUs in the node map"
            others = [
                p.name for p in site.partitions if _nodes_with_model(site, model.name, p.node_names)
            ]
            hint = f"; {model.name} is in: {', '.join(others)}" if others else ""
            raise UsageError(
                f"partition {partition.name} at site {site.name} has no {model.name} nodes "
                f"(it has: {here}){hint}"
            )
        candidates = [partition]
        problem = _policy_problem(partition, request)
        if problem is not None:
            raise UsageError(f"{problem} at site {site.name}")
    else:
        candidates = [
            p for p in site.partitions if _nodes_with_model(site, model.name, p.node_names)
        ]
        if not candidates:
            raise UsageError(
                f"no partition at site {site.name} has {model.name} nodes "
                "(check the site's partitions and node_map)"
            )
        candidates.sort(key=lambda p: not p.default)  # stable: default first, then file order
        fitting = [p for p in candidates if _policy_problem(p, request) is None]
        if not fitting:
            said = "; ".join(str(_policy_problem(p, request)) for p in candidates)
            raise UsageError(f"no partition at site {site.name} takes this job: {said}")
        candidates = fitting
    for partition in candidates:
        eligible = _fits(site, partition, model.name, request)
        if eligible:
            return partition, eligible
    raise UsageError(_impossible(site, model, request, candidates, request.partition is not None))


def _within_model_cap(model: GpuModel, request: JobRequest) -> None:
    """A model's ``max_per_job`` (a site caps MIG slices so a bigger job takes whole GPUs)."""
    total = request.gpus * request.nodes
    if model.max_per_job is not None and total > model.max_per_job:
        raise UsageError(
            f"a job may have at most {model.max_per_job} {model.name} at this site, asked for "
            f"{total}: ask for fewer, or for whole GPUs"
        )


def _impossible(
    site: Site,
    model: GpuModel,
    request: JobRequest,
    candidates: list[Partition],
    explicit: bool,
) -> str:
    where = f" in partition {candidates[0].name}" if explicit else ""
    head = (
        f"cannot give {request.gpus} {model.name} GPU(s) per node on {request.nodes} node(s) "
        f"at site {site.name}{where}"
    )
    excluded = _expand(request.exclude, "--exclude")
    outside = " outside --exclude" if excluded else ""
    eligible = {
        n
        for p in candidates
        for n in p.node_names
        if n not in excluded and _model_count(site, n, model.name) >= request.gpus
    }
    best = max(len([n for n in p.node_names if n in eligible]) for p in candidates)
    unusable = sorted(_expand(request.nodelist, "--nodelist") - eligible)
    if unusable:
        reason = (
            f"--nodelist node(s) {_compress(unusable)} cannot give {request.gpus} "
            f"{model.name} GPUs each{outside}"
        )
    elif best == 0:
        reason = f"no node has {request.gpus} {model.name} GPUs{outside}"
    else:
        reason = f"only {best} node(s) have {request.gpus} or more {model.name} GPUs{outside}"
    possible = []
    for p in candidates:
        prefix = "" if len(candidates) == 1 else f"partition {p.name}: "
        names = [model.name] + [m for m in _models_in(site, p) if m != model.name]
        possible.append(prefix + ", ".join(_capacity_text(site, p, m) for m in names))
    return f"{head}: {reason}; possible: " + "; ".join(possible)


def _policy_problem(partition: Partition, request: JobRequest) -> str | None:
    """Why a partition's limits (GPUs per job, exact GPUs per node, nodes, time) refuse the
    request, with what would fit; None when they take it."""
    shape = directives.Shape(request.gpus, request.nodes)
    problem = directives.limit_problem(partition, shape)
    if problem is None and request.time is not None:
        try:
            seconds = time_seconds(request.time)
        except ValueError as exc:
            raise UsageError(f"--time: {exc}") from None
        problem = directives.time_problem(partition, seconds, request.time)
    return problem


def _grouped(expression: str) -> str:
    """A feature expression that can be joined with ``&`` without changing its meaning:
    ``a|b`` becomes ``(a|b)`` (``a|b&ib`` would read as ``a|(b&ib)``)."""
    if "|" not in expression:
        return expression
    if expression[0] in "([" and _closes_at_end(expression):
        return expression
    return f"({expression})"


def _closes_at_end(expression: str) -> bool:
    depth = 0
    for i, c in enumerate(expression):
        depth += c in "(["
        depth -= c in ")]"
        if depth == 0 and i < len(expression) - 1:
            return False
    return True


def _combine_constraints(feature: str, user: str | None) -> str:
    if not user:
        return feature
    if any(c in user for c in "[]*"):
        raise UsageError(
            f"cannot combine --constraint {user!r} with the {feature!r} node feature this site "
            "uses to select the GPU model; use '&', '|' and parentheses in --constraint here"
        )
    return f"{_grouped(feature)}&{_grouped(user)}"


def _check_pinned(site: Site, partition: Partition, model: GpuModel) -> None:
    """Refuse a request Slurm could fill with another model's GPUs (site.pinning)."""
    problem = pinning.unpinned(site, partition, model)
    if problem:
        key = f"model_groups.{model.name}" if model.members else f"models.{model.name}"
        raise ConfigError(ConfigIssue(str(site.source), None, key, problem))


def _model_config_error(site: Site, model: GpuModel, key: str, message: str) -> ConfigError:
    return ConfigError(ConfigIssue(str(site.source), None, f"models.{model.name}.{key}", message))


def gres_request(
    site: Site, model: GpuModel, gpus: int, nodes: int, constraint: str | None
) -> tuple[GresRequest, str | None]:
    """The GPU request in the site's syntax, and the user's constraint if not merged into it.

    The site's syntax (``clusterjob.site.gpu_syntax``) spells the GPU count. A model with a
    node feature (``constraint``) then always gets ``--constraint=FEATURE`` (the user's
    constraint joined with ``&``).
    """
    syntax = site.gpu_syntax
    gaps = syntax.gaps(model, site.type_required)
    if gaps:
        raise _model_config_error(site, model, gaps[0].key, gaps[0].at_request)
    spelled = syntax.options(model, gpus, nodes, site.type_required)
    if model.constraint:
        # Untyped GRES: the feature is the only way to land on this model. Typed: some sites'
        # submit filters want both (e.g. --gpus-per-node=TYPE:N --constraint=FEATURE).
        combined = _combine_constraints(model.constraint, constraint)
        options = (*spelled.options, f"--constraint={combined}")
        return GresRequest(options, gpus, nodes, spelled.gres_type), None
    return GresRequest(spelled.options, gpus, nodes, spelled.gres_type), constraint


# --- arrays, sweeps and signals -------------------------------------------------------------

_SWEEP_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_SIGNAL = re.compile(r"(?P<b>[A-Za-z]*:)?(?P<sig>[A-Za-z0-9]+)(?P<at>@[0-9]+)?")


def sweep_task_args(sweeps: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """``--sweep lr=1e-4,3e-4 --sweep bs=32,64``: one task per combination (the cartesian
    product, the last sweep varying fastest), each getting ``--lr=1e-4 --bs=32``."""
    axes: list[list[str]] = []
    names: list[str] = []
    for sweep in sweeps:
        name, sep, values = sweep.partition("=")
        if not sep or not _SWEEP_NAME.fullmatch(name):
            raise UsageError(f"--sweep {sweep!r}: expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4)")
        if name in names:
            raise UsageError(f"--sweep {name} is given twice; list all its values in one")
        items = values.split(",")
        if any(v == "" for v in items):
            raise UsageError(f"--sweep {sweep!r}: an empty value (two commas, or a trailing one)")
        names.append(name)
        axes.append(items)
    return tuple(
        tuple(f"--{n}={v}" for n, v in zip(names, combo, strict=True))
        for combo in itertools.product(*axes)
    )


def params_task_args(text: str, source: str = "--params") -> tuple[tuple[str, ...], ...]:
    """``--params FILE``: one task per non-blank line that is not a ``#`` comment; a line is
    a JSON list of strings or shell words (``--lr 1e-4 --name 'run one'``)."""
    tasks: list[tuple[str, ...]] = []
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        where = f"{source}:{number}"
        if stripped.startswith("["):
            try:
                words = json.loads(stripped)
            except ValueError as exc:
                raise UsageError(f"{where}: not a JSON list: {exc}") from None
            if not isinstance(words, list) or not all(isinstance(w, str) for w in words):
                raise UsageError(f"{where}: a JSON line must be a list of strings")
        else:
            try:
                words = shlex.split(stripped)
            except ValueError as exc:
                raise UsageError(f"{where}: cannot split it into arguments: {exc}") from None
        tasks.append(tuple(words))
    if not tasks:
        raise UsageError(f"{source}: no task lines (one line of arguments per task)")
    return tasks_tuple(tasks)


def tasks_tuple(tasks: Sequence[Sequence[str]]) -> tuple[tuple[str, ...], ...]:
    return tuple(tuple(t) for t in tasks)


def _array_and_signal(request: JobRequest) -> tuple[JobRequest, tuple[str, ...]]:
    """The ``--array`` a sweep needs, and a single-node ``--signal`` sent to the batch shell
    (``B:``): the script ``exec``s the program there, and without ``B:`` Slurm signals only
    job steps, of which a single-node job has none."""
    array = request.array
    if array is not None:
        picked = request.task_args and _sweep_tasks(array, len(request.task_args))
        if request.task_args and not picked and not re.fullmatch(r"%[0-9]+", array):
            raise UsageError(
                f"--array {array!r} with --sweep/--params: the tasks come from the sweep; give "
                "only a limit of tasks running at once, e.g. --array %4"
            )
        if not request.task_args:
            try:
                array_task_ids(array)
            except ValueError as exc:
                raise UsageError(f"--array: {exc}") from None
        if picked:  # some tasks of the sweep (resubmit --failed): their own indices
            return _signal(request, array)
    if request.task_args:
        array = f"0-{len(request.task_args) - 1}{array or ''}"
    return _signal(request, array)


def _sweep_tasks(array: str, count: int) -> bool:
    """Whether ``array`` names tasks of a sweep of ``count`` tasks by their indices (``1,3``,
    ``2``, ``0-1%1``), as ``resubmit`` does to run some of them again; a range past the
    sweep's end is not such a choice (it is refused as before)."""
    if array.startswith("%"):
        return False
    try:
        ids = array_task_ids(array)
    except ValueError:
        return False
    return bool(ids) and all(0 <= i < count for i in ids)


def _signal(request: JobRequest, array: str | None) -> tuple[JobRequest, tuple[str, ...]]:
    notes: list[str] = []
    signal = request.signal
    if signal is not None:
        m = _SIGNAL.fullmatch(signal)
        if m is None:
            raise UsageError(f"--signal {signal!r}: expected [B:]SIG[@SECONDS], e.g. USR1@90")
        if m.group("b") is None and request.nodes == 1:
            signal = f"B:{signal}"
            notes.append(
                f"--signal {request.signal} sent as {signal}: a single-node job's program runs "
                "in the batch shell, where only B: signals arrive"
            )
    return replace(request, array=array, signal=signal), tuple(notes)


LAUNCHERS = ("torchrun", "srun", "none")


def choose_launcher(request: JobRequest) -> str:
    """What starts the program on the nodes. By default: srun when more than one task per
    node is asked for, torchrun over several nodes, else the batch shell itself (none).
    ``--tasks-per-node`` never silently does nothing: where it cannot apply it is refused."""
    launcher = request.launcher
    tasks = request.tasks_per_node or 1
    if launcher is None:
        several = request.nodes > 1
        launcher = (
            "srun"
            if tasks > 1 or (several and request.gpus == 0)
            else ("torchrun" if several else "none")
        )
    if launcher == "torchrun" and request.gpus == 0:
        raise UsageError(
            "--launcher torchrun starts one worker per GPU, and this job has none (--gpus 0): "
            "use --launcher srun"
        )
    if launcher not in LAUNCHERS:
        raise UsageError(
            f"--launcher {launcher!r}: expected one of {', '.join(LAUNCHERS)}"
            f"{did_you_mean(launcher, LAUNCHERS)}"
        )
    if tasks > 1 and launcher == "torchrun":
        raise UsageError(
            f"--tasks-per-node {tasks} with --launcher torchrun: torchrun starts one worker per "
            "GPU itself (--gpus); drop --tasks-per-node, or use --launcher srun"
        )
    if tasks > 1 and launcher == "none":
        raise UsageError(
            f"--tasks-per-node {tasks} with --launcher none would start one process: use "
            "--launcher srun (one task each), or start them yourself and drop --tasks-per-node"
        )
    if request.launcher_args and launcher == "none":
        raise UsageError("--launcher-arg needs a launcher: --launcher torchrun or srun")
    for arg in request.launcher_args:
        check_no_nul(arg, "--launcher-arg")
    return launcher


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def check_setup(request: JobRequest) -> tuple[tuple[str, str], ...]:
    """``--setup`` lines are one line each; ``--module`` names one module; ``--env`` is
    KEY=VALUE with KEY a shell variable name. Returns the ``--env`` pairs."""
    for line in request.setup:
        check_no_nul(line, "--setup")
        if "\n" in line or "\r" in line:
            raise UsageError(f"--setup {line!r}: one line each (repeat --setup for more)")
        if not line.strip():
            raise UsageError("--setup must not be empty")
    for name in request.modules:
        check_no_nul(name, "--module")
        if not name or any(c.isspace() for c in name):
            raise UsageError(f"--module {name!r}: one module name (repeat --module for more)")
    pairs = []
    for item in request.env:
        check_no_nul(item, "--env")
        key, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(key):
            raise UsageError(
                f"--env {item!r}: expected KEY=VALUE with KEY a variable name (e.g. HF_HOME=/data)"
            )
        pairs.append((key, value))
    return tuple(pairs)


def program_argv(request: JobRequest) -> tuple[bool, tuple[str, ...]]:
    """Whether the job's Python starts the program, and the words that follow: a script runs
    as ``"$python" SCRIPT ARGS``; a command as given, ``python``/``python3`` there meaning the
    job's interpreter (``python -m pkg``). With a snapshot, the program's own file is its
    copy there (``program.snapshot_word``)."""
    words = [request.script, *request.args]
    where = snapshot_word(request.script, request.args, command=request.command)
    if request.snapshot and where is not None:
        words[where] = posixpath.join(request.snapshot, posixpath.normpath(words[where]))
    if not request.command:
        return True, tuple(words)
    if request.script in PYTHON_COMMANDS:
        return True, tuple(words[1:])
    return False, tuple(words)


def _check_container(request: JobRequest) -> str | None:
    """The container image (pyxis or apptainer) the program runs in, if any."""
    given = [
        (option, value)
        for option, value in (
            ("--container-image", request.container_image),
            ("--container-mounts", request.container_mounts),
            ("--apptainer", request.apptainer),
        )
        if value is not None
    ]
    for option, value in given:
        check_no_nul(value, option)
        if not value.strip():
            raise UsageError(f"{option} must not be empty")
    if request.container_image is not None and request.apptainer is not None:
        raise UsageError("--container-image and --apptainer exclude each other: give one")
    if request.container_mounts is not None and request.container_image is None:
        raise UsageError("--container-mounts needs --container-image (pyxis)")
    image = request.container_image or request.apptainer
    if image is not None and (request.venv is not None or request.conda is not None):
        option = "--venv" if request.venv is not None else "--conda"
        raise UsageError(
            f"{option} names an environment on the host; in a container give --python PATH "
            "(a path inside the image) or nothing (python3 in the image)"
        )
    return image


def _interpreter(
    site: Site, partition: Partition, request: JobRequest, environ: Mapping[str, str]
) -> Interpreter | None:
    """The interpreter recorded at submit (resubmit), else the one chosen now. In a
    container: ``--python`` as a path in the image (unchecked here), else its python3."""
    image = _check_container(request)
    if image is not None:
        if request.python is not None and request.python_why is not None:
            return Interpreter(request.python, request.python_why)
        if request.python is not None:
            return Interpreter(request.python, f"--python, in the container image {image}")
        return Interpreter("python3", f"python3 in the container image {image}")
    if request.python_why is not None and (request.python or request.conda):
        prefix = "recorded at submit: "
        why = request.python_why
        why = why if why.startswith(prefix) else prefix + why
        if request.conda is not None:
            exe = interpreters.find_conda(environ)
            return Interpreter(None, why, conda=request.conda, conda_exe=exe)
        assert request.python is not None
        python = interpreters.check_python(request.python, "the recorded interpreter")
        return Interpreter(python, why, venv=request.venv, bin_dir=str(Path(python).parent))
    submitted = None
    if request.submit_python is not None or request.active_env is not None:
        submitted = SubmitPython(request.submit_python, request.active_env)
    return interpreters.choose(
        python=request.python,
        venv=request.venv,
        conda=request.conda,
        submitted=submitted,
        site_job=site.job,
        partition_job=partition.job,
        site_file=site.source.name,
        partition=partition.name,
        environ=environ,
    )


def resolve(
    site: Site,
    request: JobRequest,
    *,
    environ: Mapping[str, str] | None = None,
    choose_interpreter: bool = True,
) -> ResolvedJob:
    """Make ``request`` concrete for ``site``, or say in one line why it cannot be.

    Besides the site, only the file system is read: that a chosen interpreter exists and is
    executable, and (``--conda``) where conda is, from ``environ`` (default ``os.environ``).
    ``choose_interpreter=False``: no interpreter (a job that is never run: ``avail``'s
    estimate, an interactive shell), so a site's node-only interpreter does not stop it.
    """
    request = _whole_node_gpus(site, _partition_of_qos(site, request))
    _check_text_fields(request)
    _check_retry_bad_node(request)
    _check_node_names(site, request)
    request, notes = _array_and_signal(request)
    model, partition, eligible = _model_and_partition(site, request)
    defaults = directives.effective_defaults(
        site.defaults, partition.defaults, model.defaults if model else JobDefaults()
    )
    time, seconds = _time_within_limit(
        site, partition, request.time if request.time is not None else defaults.time
    )
    gres, constraint, split_note = _gpu_request(site, model, request)
    notes += split_note
    extra_gres, user_args = directives.split_sbatch_args(request.sbatch_args, model is not None)
    extra = directives.merge_gres(
        defaults.gres, directives.check_gres(request.gres, "--gres"), extra_gres
    )
    gres = replace(gres, options=directives.with_gres(gres.options, extra))
    sbatch_args = directives.merge_sbatch_lines(defaults.sbatch, user_args)
    qos = _job_qos(site, partition, request, defaults, seconds)
    _check_qos_limits(site, partition, qos, request, time, seconds)
    if time is None:
        time = _qos_time(site, partition, qos)
    account = _job_account(site, partition, request, defaults, environ)
    interpreter = None
    if choose_interpreter:
        interpreter = _interpreter(
            site, partition, request, os.environ if environ is None else environ
        )
    if interpreter is not None:
        request = replace(
            request,
            python=interpreter.python,
            venv=interpreter.venv,
            conda=interpreter.conda,
            python_why=interpreter.why,
        )
    layout = _task_layout(site, request, defaults, model is not None)
    runs_python, argv = program_argv(request)
    launcher = choose_launcher(replace(request, tasks_per_node=layout.tasks_per_node))
    job_name = request.job_name or Path(request.script).stem or "clusterjob"
    return ResolvedJob(
        request=request,
        site_name=site.name,
        model=model,
        partition=partition,
        gres=gres,
        nodes=request.nodes,
        gpus_per_node=request.gpus,
        tasks_per_node=layout.tasks_per_node or 1,
        job_name=check_directive_value(job_name, "the job name"),
        account=account,
        qos=qos,
        cpus_per_gpu=layout.cpus_per_gpu,
        mem_per_gpu=layout.mem_per_gpu,
        time=time,
        constraint=constraint,
        eligible_nodes=tuple(eligible),
        token=request.token,
        notes=notes,
        interpreter=interpreter,
        runs_python=runs_python,
        argv=argv,
        launcher=launcher,
        env=check_setup(request),
        partition_option=partition.submit_as == "partition",
        sbatch_args=sbatch_args,
        sbatch_tasks_per_node=layout.sbatch_tasks_per_node,
        cpus_per_task=layout.cpus_per_task,
        mem=layout.mem,
        preflight=partition.preflight or site.preflight,
        max_requeues=_max_requeues(request, defaults),
    )


def _model_and_partition(
    site: Site, request: JobRequest
) -> tuple[GpuModel | None, Partition, list[str]]:
    """The GPU model asked for (None: a CPU-only job), as this site names it, and the
    partition that holds it with its eligible nodes."""
    if request.gpus == 0:
        partition, eligible = _cpu_partition(site, request)
        return None, partition, eligible
    model = _find_model(site, request)
    _within_model_cap(model, request)
    partition, eligible = _choose_partition(site, model, request)
    if site.gpu_syntax.name != "gres+constraint":  # that syntax needs the feature
        nodes = (site.gres_models(n) for n in partition.node_names)
        model = directives.without_group_feature(model, (m for m in nodes if m))
    _check_pinned(site, partition, model)
    return model, partition, eligible


def _time_within_limit(
    site: Site, partition: Partition, time: str | None
) -> tuple[str | None, int | None]:
    """The time asked for (or the defaults'), and its seconds; an error past the partition's
    limit."""
    if time is None:
        return None, None
    try:
        seconds = time_seconds(time)
    except ValueError as exc:
        raise UsageError(f"--time: {exc}") from None
    limit = time_seconds(partition.time_limit) if partition.time_limit else None
    if limit is not None and (seconds is None or seconds > limit):
        raise UsageError(
            f"--time {time} is longer than partition {partition.name}'s limit "
            f"{partition.time_limit} at site {site.name}"
        )
    return time, seconds


def _gpu_request(
    site: Site, model: GpuModel | None, request: JobRequest
) -> tuple[GresRequest, str | None, tuple[str, ...]]:
    """The GPUs in the site's own syntax, its constraint, and a note where that syntax
    cannot say a multi-node job's GPUs per node."""
    if model is None:
        return GresRequest((), 0, request.nodes, None), request.constraint, ()
    gres, constraint = gres_request(site, model, request.gpus, request.nodes, request.constraint)
    if site.gpu_syntax.name != "gpus" or request.nodes <= 1:
        return gres, constraint, ()
    if site.form.multi_node != "per-node":
        note = (
            f"--gpus={request.gpus * request.nodes} is a total over {request.nodes} nodes: "
            "Slurm may split it unevenly (the preflight checks each node's share)"
        )
        return gres, constraint, (note,)
    per_node = f"--gpus-per-node={gres.gres_type + ':' if gres.gres_type else ''}"
    options = tuple(
        f"{per_node}{request.gpus}" if o.startswith("--gpus=") else o for o in gres.options
    )
    return replace(gres, options=options), constraint, ()


def _job_account(
    site: Site,
    partition: Partition,
    request: JobRequest,
    defaults: JobDefaults,
    environ: Mapping[str, str] | None,
) -> str | None:
    """--account as given, else the site's for --project (or its default), checked."""
    if request.account is not None and request.project is not None:
        raise UsageError("--account and --project exclude each other: --account is used as given")
    if request.account is not None:
        return request.account
    account = directives.account_for(defaults.account, request.project, site.name)
    _check_account(site, partition, account, defaults.account, environ)
    return account


class _TaskLayout(NamedTuple):
    """A job's tasks, CPUs and memory as its directives say them."""

    tasks_per_node: int | None  # asked for, or the site's count
    sbatch_tasks_per_node: int | None  # written as --ntasks-per-node (one task per GPU...)
    cpus_per_gpu: int | None
    cpus_per_task: int | None
    mem_per_gpu: str | None
    mem: str | None  # --mem, where the site gives memory per node


def _task_layout(
    site: Site, request: JobRequest, defaults: JobDefaults, has_gpus: bool
) -> _TaskLayout:
    if not has_gpus:  # per-GPU defaults mean nothing without GPUs (Slurm refuses them)
        defaults = replace(defaults, cpus_per_gpu=None, mem_per_gpu=None)
    cpus_per_gpu = (
        request.cpus_per_gpu if request.cpus_per_gpu is not None else defaults.cpus_per_gpu
    )
    mem_per_gpu = request.mem_per_gpu if request.mem_per_gpu is not None else defaults.mem_per_gpu
    sbatch_tasks, cpus_per_task = None, None
    one_task_per_gpu = site.gpu_syntax.name == "gpus-per-task"
    asked_tasks = request.tasks_per_node
    if asked_tasks is None:
        asked_tasks = _site_task_count(site, defaults, has_gpus)
    if has_gpus and one_task_per_gpu and asked_tasks not in (None, request.gpus):
        raise UsageError(
            f"--tasks-per-node {asked_tasks}: site {site.name} gives each task one GPU "
            f"({site.gpu_syntax.usage}), so {request.gpus} GPU(s) a node are "
            f"{request.gpus} task(s) a node: drop --tasks-per-node"
        )
    if has_gpus and (site.form.cpus == "cpus-per-task" or one_task_per_gpu):
        # one task per GPU unless asked otherwise (e.g. one task driving a node's GPUs)
        sbatch_tasks = asked_tasks if asked_tasks is not None else request.gpus
        if cpus_per_gpu is not None:
            cpus_per_task = max(1, cpus_per_gpu * request.gpus // sbatch_tasks)
    if request.cpus_per_gpu is None and defaults.cpus_per_task is not None:
        cpus_per_gpu, cpus_per_task = None, defaults.cpus_per_task
    mem = None
    if has_gpus and site.form.memory == "mem" and mem_per_gpu is not None:
        mem = _times(mem_per_gpu, request.gpus)
    return _TaskLayout(asked_tasks, sbatch_tasks, cpus_per_gpu, cpus_per_task, mem_per_gpu, mem)


def _check_retry_bad_node(request: JobRequest) -> None:
    """--retry-bad-node: a whole number, 0 or more; one job at a time (an array's tasks end
    on many nodes, each its own way: `resubmit --failed` runs those again)."""
    value = request.retry_bad_node
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise UsageError(f"--retry-bad-node {value!r}: give a whole number of retries, 0 or more")
    if value and (request.array is not None or request.task_args):
        raise UsageError(
            "--retry-bad-node works on one job, not an array or a sweep: "
            "`clusterjob resubmit --failed ID` runs the tasks that failed again"
        )


def _max_requeues(request: JobRequest, defaults: JobDefaults) -> int:
    """The user's --max-requeues, else the site's default, else ``DEFAULT_MAX_REQUEUES``."""
    if request.max_requeues is not None:
        return check_max_requeues(request.max_requeues)
    if defaults.max_requeues is not None:
        return defaults.max_requeues
    return DEFAULT_MAX_REQUEUES


def _site_task_count(site: Site, defaults: JobDefaults, has_gpus: bool) -> int | None:
    """The site's task shape (``defaults.tasks_per_node``) for a job that gives none; a
    config error where each task is one GPU (``gpus-per-task``: the tasks are the GPUs)."""
    if defaults.tasks_per_node is not None and has_gpus and site.gpu_syntax.name == "gpus-per-task":
        raise ConfigError(
            ConfigIssue(
                str(site.source),
                None,
                "defaults.tasks_per_node",
                "gpu_request.syntax gpus-per-task gives each task one GPU: a job's tasks are "
                "its GPUs, so it cannot have a task count of its own",
            )
        )
    return defaults.tasks_per_node


def _partition_of_qos(site: Site, request: JobRequest) -> JobRequest:
    """A ``--qos`` that picks the partition when none is named: the partition that is that
    QoS (``submit_as: qos``), or the first partition a QoS with limits is used with that has
    the model asked for (``--qos devel`` goes to ``accel``)."""
    if request.partition is not None or request.qos is None:
        return request
    queue = site.partition(request.qos)
    if queue is not None and queue.submit_as == "qos":
        return replace(request, partition=queue.name)
    limits = site.qos_limits(request.qos)
    if limits is None or not limits.partitions:
        return request
    wanted = _model_name(site, request.model)
    for name in limits.partitions:
        partition = site.partition(name)
        if wanted is None or partition is None:
            return replace(request, partition=name)
        if _nodes_with_model(site, wanted, partition.node_names):
            return replace(request, partition=name)
    return replace(request, partition=limits.partitions[0])


def _model_name(site: Site, asked: str | None) -> str | None:
    """The canonical name of the model or model group ``--model`` names; None if unknown."""
    found = (site.model(asked) or site.group(asked)) if asked is not None else None
    return found.name if found is not None else None


def _whole_node_gpus(site: Site, request: JobRequest) -> JobRequest:
    """Where the site asks for GPUs with no option (syntax ``none``), a partition with
    ``gpus_per_node`` gives every job its nodes' GPUs: a job there that names no ``--gpus``
    is a GPU job with that many per node, so its preflight checks them (as a CPU-only job it
    would check nothing on nodes whose GPUs it holds)."""
    if request.gpus != 0 or site.gpu_syntax.name != "none":
        return request
    if request.partition is not None:
        partition = site.partition(request.partition)
    else:  # as the job's partition is chosen: the default first, one with the model
        ordered = sorted(site.partitions, key=lambda p: not p.default)
        wanted = _model_name(site, request.model)
        if wanted is not None:
            ordered = [p for p in ordered if _nodes_with_model(site, wanted, p.node_names)]
        partition = ordered[0] if ordered else None
    if partition is None or partition.gpus_per_node is None:
        return request
    return replace(request, gpus=partition.gpus_per_node)


def _check_qos_limits(
    site: Site,
    partition: Partition,
    qos: str | None,
    request: JobRequest,
    time: str | None,
    seconds: int | None,
) -> None:
    """A QoS with limits (the site's ``qos:``): used with its partitions only, and the job
    within its time, GPUs and nodes; refused here in one line naming the limit and the QoS."""
    limits = site.qos_limits(qos) if qos is not None else None
    if limits is None:
        return
    if limits.partitions and partition.name not in limits.partitions:
        raise UsageError(
            f"QoS {limits.name} at site {site.name} is used with partition "
            f"{' or '.join(limits.partitions)}, not {partition.name}"
        )
    shape = directives.Shape(request.gpus, request.nodes)
    problem = directives.qos_problem(limits, shape, seconds, time)
    if problem is not None:
        raise UsageError(f"{problem} at site {site.name}")


def _qos_time(site: Site, partition: Partition, qos: str | None) -> str | None:
    """The ``--time`` of a job that gives none under a QoS with a ``max_time``: that time
    (Slurm would give it the partition's default, which may be past the QoS's limit), unless
    the partition's own limit is shorter."""
    limits = site.qos_limits(qos) if qos is not None else None
    if limits is None or limits.max_time is None:
        return None
    wanted = time_seconds(limits.max_time)
    limit = time_seconds(partition.time_limit) if partition.time_limit else None
    if wanted is None or (limit is not None and wanted > limit):
        return None
    return limits.max_time


def _check_account(
    site: Site,
    partition: Partition,
    account: str | None,
    pattern: str | None,
    environ: Mapping[str, str] | None,
) -> None:
    """``account: required`` (the site's, or the partition's over it): a job charged to no
    account is refused here, before sbatch, as the site's Slurm would refuse it. sbatch
    reads ``SBATCH_ACCOUNT`` itself, so that counts as given."""
    rule = partition.account or site.account
    env = os.environ if environ is None else environ
    if rule != "required" or account is not None or env.get("SBATCH_ACCOUNT"):
        return
    where = f"site {site.name}"
    if partition.account == "required":
        where = f"partition {partition.name} at site {site.name}"
    if pattern is not None and directives.PROJECT_FIELD in pattern:
        how = f"give --project (accounts here are {pattern}) or --account"
    else:
        how = "give --account NAME (-A), or set SBATCH_ACCOUNT"
    raise UsageError(f"{where} charges every job to an account: {how}")


def _job_qos(
    site: Site,
    partition: Partition,
    request: JobRequest,
    defaults: JobDefaults,
    seconds: int | None,
) -> str | None:
    """The user's --qos; the partition's name where the QoS is the queue; the QoS the job's
    time picks (qos_by_time); the default QoS."""
    if partition.submit_as == "qos":
        if request.qos is not None and request.qos != partition.name:
            raise UsageError(
                f"at site {site.name} the QoS is the queue: --qos {request.qos} and partition "
                f"{partition.name} contradict each other (give one)"
            )
        return partition.name
    if request.qos is not None:
        return request.qos
    if defaults.qos_by_time:
        return directives.qos_for_time(defaults.qos_by_time, seconds)
    return defaults.qos


def _times(size: str, count: int) -> str:
    """A Slurm memory size times ``count``: ``60G`` x 4 -> ``240G``."""
    unit = size[-1] if size[-1].isalpha() else ""
    number = int(size[:-1] if unit else size)
    return f"{number * count}{unit}"
