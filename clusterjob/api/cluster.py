"""``Cluster`` and ``Job``: clusterjob from Python, over the same core as the command line.

    import clusterjob

    cluster = clusterjob.Cluster()                     # this login node; or host="hpc"
    job = cluster.submit("train.py", args=["--lr", "3e-4"], gpus=2, model="A100")
    job.wait()                                         # the final JobStatus
    print(job.logs())

    def square(x):
        return x * x

    jobs = cluster.options(time="0:10:00").map(square, range(20))   # ONE array job
    print([j.result() for j in jobs])

Every keyword of ``submit`` is a ``clusterjob submit`` option (``--cpus-per-gpu`` is
``cpus_per_gpu``), checked by the same code, failing with the same one-line errors, as
exceptions of ``clusterjob.errors`` (``UsageError``, ``SlurmError``, ...).

A ``Job`` is a ``concurrent.futures.Future``: ``concurrent.futures.wait`` and
``as_completed`` work on it. Its state comes from one poller per ``Cluster`` that asks Slurm
about ALL its unfinished jobs at once (one squeue, one sacct), through the status cache every
clusterjob process shares: every ``poll_interval`` seconds for a command job; a function
job's end is its result file, looked for often, Slurm asked less and less (``polling``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from clusterjob.api.polling import first_slurm_look
from clusterjob.errors import (
    ClusterjobError,
    JobFailed,
    JobTimeout,
    SlurmError,
    SubmissionUncertain,
    UsageError,
)
from clusterjob.slurm.runner import LocalTransport, Runner, SlurmResult, SshTransport

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from typing import Any

    from clusterjob.api.remote import HostProfile
    from clusterjob.jobs.badnodes import AvoidList
    from clusterjob.jobs.registry import JobRecord, Registry
    from clusterjob.jobs.status import JobStatus, StatusCache
    from clusterjob.jobs.submit import Submitted, TestOnlyResult
    from clusterjob.jobs.wait import WaitResult
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import JobRequest, ResolvedJob
    from clusterjob.site.model import Site
    from clusterjob.slurm.commands import SlurmClient

# seconds between the poller's looks at Slurm (as `wait`): a command job's; a function job's
# at first, backing off (polling.slurm_interval), its result file looked for in between
DEFAULT_POLL_INTERVAL = 10.0
CHECKPOINT_GRACE = 90  # seconds before the time limit a checkpointable function is warned
RESULT_GRACE = 30.0  # how long a COMPLETED function job's result file may lag (shared fs)
WORKER_NAME = "clusterjob_worker.py"
REMOTE_SNAPSHOTS = ".clusterjob/snapshots"  # --snapshot over ssh: under the job's directory
# The snapshots on the login node: "MTIME NAME" per directory (none when there is no folder).
_LIST_SNAPSHOTS = (
    'cd -- "$1" 2>/dev/null || exit 0; for d in *; do if [ -d "$d" ] && [ ! -L "$d" ]; then '
    'printf "%s %s\\n" "$(stat -c %Y -- "$d")" "$d"; fi; done; exit 0'
)

# The keywords of submit(), as `clusterjob submit` options: name -> default.
JOB_OPTIONS: dict[str, object] = {
    "gpus": None, "model": None, "nodes": 1, "partition": None, "time": None,
    "account": None, "qos": None, "cpus_per_gpu": None, "mem_per_gpu": None,
    "job_name": None, "array": None, "dependency": None, "output": None, "error": None,
    "signal": None, "requeue": False, "exclude": None, "nodelist": None, "mail_type": None,
    "mail_user": None, "constraint": None, "sbatch_args": (), "tasks_per_node": None,
    "launcher": None, "launcher_args": (), "setup": (), "modules": (), "env": (),
    "container_image": None, "container_mounts": None, "apptainer": None, "python": None,
    "venv": None, "conda": None, "sweep": (), "params": None, "gres": (), "project": None,
    "max_requeues": None, "snapshot": None, "retry_bad_node": 0, "avoid": True,
}  # fmt: skip

# The keywords of shell(), as `clusterjob shell` options (a subset of JOB_OPTIONS).
SHELL_OPTIONS = ("gpus", "model", "partition", "time", "account", "qos", "cpus_per_gpu",
                 "mem_per_gpu", "constraint", "exclude", "nodelist", "job_name")  # fmt: skip


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a job, as the ``__cause__`` of the exception
    that ``Job.result()`` re-raises (as ``concurrent.futures.ProcessPoolExecutor`` does)."""

    def __init__(self, text: str) -> None:
        self.text = text
        super().__init__(text)

    def __str__(self) -> str:
        return f'\n"""\n{self.text.rstrip()}\n"""'


def requeue(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, ...]:
    """What a ``checkpoint`` method returns to have its job requeued and call
    ``fn(*args, **kwargs)`` in the next attempt (``fn`` is usually ``self``, its state kept)."""
    return (fn, args, kwargs)


@dataclass(frozen=True)
class Prepared:
    """A job resolved and rendered for the site, before anything is sent to Slurm."""

    resolved: ResolvedJob
    rendered: RenderedJob
    avoiding: str | None = None  # "avoiding gpu3 (preflight failed 2h ago: ...)", if any

    @property
    def notes(self) -> tuple[str, ...]:
        return self.resolved.notes + ((self.avoiding,) if self.avoiding else ())

    @property
    def script(self) -> str:
        return self.rendered.script


class Cluster:
    """One Slurm cluster: this machine's (the default), or a login node reached over ssh.

    ``site``: a site name or YAML file (default: the documented discovery; for a remote
    cluster, its own site config, fetched and cached). ``host``: ``[USER@]HOST[:PORT]`` or a
    profile of ``~/.config/clusterjob/hosts.yaml`` (default ``$CLUSTERJOB_HOST``; ``""``:
    this machine whatever the environment says). ``workdir``: the directory jobs are
    submitted from (default: the current one); for a remote cluster, the one synced to
    ``remote_dir`` there unless ``sync=False`` (then ``remote_dir`` already holds the code).
    ``snapshot``: run each job from a copy of its code taken at submit (``--snapshot``; a job
    keyword ``snapshot=`` wins). ``debug``: check each job as for Slurm, then run it here, in
    this process, at submit (functions called directly: ``breakpoint()`` works); nothing is
    sent to Slurm, and the jobs are ``DebugJob``s (ids ``debug-1``, ...).
    """

    def __init__(
        self,
        site: str | None = None,
        *,
        host: str | None = None,
        workdir: str | Path | None = None,
        remote_dir: str | None = None,
        sync: bool | None = None,
        python: str | None = None,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
        exec: Callable[[Sequence[str], float, str | None], SlurmResult] | None = None,
        snapshot: bool = False,
        debug: bool = False,
    ) -> None:
        from clusterjob.api.remote import HOST_ENV, host_profile

        spec = os.environ.get(HOST_ENV, "") if host is None else host
        self.profile: HostProfile | None = host_profile(spec) if spec.strip() else None
        self.transport: LocalTransport = (
            SshTransport(self.profile.target) if self.profile else LocalTransport()
        )
        self.host = self.transport.label  # "" for this machine
        self._site_spec = site or (self.profile.site if self.profile else None)
        self._site: Site | None = None
        self.workdir = Path(workdir or os.getcwd()).resolve()
        self._remote_dir = remote_dir or (self.profile.remote_dir if self.profile else None)
        self._sync = sync if sync is not None else (self.profile.sync if self.profile else True)
        self._python = python or (self.profile.python if self.profile else None)
        self._remote_abs: str | None = None
        self._remote_python: str | None = None
        if not poll_interval > 0:
            raise UsageError("poll_interval must be a positive number of seconds")
        self.poll_interval = poll_interval
        self._exec = exec
        self._calls_lock = threading.Lock()
        self._calls = [0]  # shared with the views of options()
        self._defaults: dict[str, object] = {}
        self._poller = _Poller(self)
        self.snapshot = bool(snapshot)
        self.debug = bool(debug)
        self._debug_ids = [0]  # shared with the views of options()

    def __repr__(self) -> str:
        where = f"host={self.host!r}" if self.host else "local"
        debug = ", debug=True" if self.debug else ""
        return f"Cluster({where}, site={self._site_spec!r}{debug})"

    @property
    def remote(self) -> bool:
        return self.transport.remote

    @property
    def slurm_calls(self) -> int:
        """Slurm commands run for this cluster so far (every attempt counts)."""
        return self._calls[0]

    # --- the core's handles -------------------------------------------------------------------

    def _counted(self, cmd: Sequence[str], timeout: float, input: str | None) -> SlurmResult:
        with self._calls_lock:
            self._calls[0] += 1
        return (self._exec or self.transport.exec)(cmd, timeout, input)

    def client(self, budget: float | None = None) -> SlurmClient:
        """A Slurm client for one operation (its own deadline), through this cluster's
        transport; every command is counted in ``slurm_calls``."""
        from clusterjob.slurm.commands import SlurmClient

        return SlurmClient(Runner(self._counted, transport=self.transport, budget=budget))

    def registry(self) -> Registry:
        from clusterjob.jobs.registry import Registry

        return Registry(host=self.host)

    def cache(self) -> StatusCache:
        from clusterjob.jobs.status import StatusCache

        return StatusCache(host=self.host)

    @property
    def site(self) -> Site:
        """The site config (loaded once): the one named, else the discovery order here or,
        for a remote cluster, the cluster's own (fetched over ssh, cached an hour)."""
        if self._site is None:
            from clusterjob.site.discovery import find_site
            from clusterjob.site.sitecache import load_site

            if self._site_spec or not self.remote:
                from clusterjob.site.initcache import described_site_file

                path = find_site(
                    self._site_spec,
                    environ=os.environ,
                    cluster_name=lambda: self.client().cluster_name(),
                    # no site file for this cluster: `site init`'s description, cached
                    describe=None if self.remote else lambda name: described_site_file(name),
                )
            else:
                from clusterjob.api.remote import remote_site_file

                assert isinstance(self.transport, SshTransport)
                path = remote_site_file(
                    self.transport, cluster_name=lambda: self.client().cluster_name()
                )
            self._site = load_site(path)
        return self._site

    # --- submitting ---------------------------------------------------------------------------

    def options(self, **options: Any) -> Cluster:
        """A view of this cluster whose jobs (``submit``, ``prepare``, ``submit_function``,
        ``map``) get these ``submit`` keywords (``gpus=1, time="1:00:00"``) unless a call gives
        its own; checked as the command line's options when a job is prepared. It shares the
        poller."""
        _check_option_names(options)
        other = object.__new__(Cluster)
        other.__dict__.update(self.__dict__)
        other._defaults = {**self._defaults, **options}
        return other

    def prepare(
        self,
        program: str | Sequence[str],
        args: Sequence[str] = (),
        *,
        token: str | None = None,
        **options: Any,
    ) -> Prepared:
        """Resolve and render a job (what ``--dry-run`` prints): nothing is sent to Slurm but
        the look-ups a site may need. ``program``: a ``.py`` script, or a command and its
        words (``["torchrun", "--nproc-per-node=2", "train.py"]``)."""
        from clusterjob.jobscript.program import Program, classify
        from clusterjob.jobscript.render import render
        from clusterjob.jobscript.request import (
            JobRequest,
            new_token,
            params_task_args,
            resolve,
            sweep_task_args,
        )

        o = self._job_options(options)
        token = token or new_token()
        snapshot = self._snapshot_dir(new_token(), o["snapshot"])  # a name of its own, see there
        named = ("python", "venv", "conda", "container_image", "apptainer")
        submit_python = None  # a pyenv shim on PATH resolves while the site loads
        if not self.remote and not any(o[k] for k in named):
            from clusterjob.jobscript.submit_python import start_find_submit_python

            submit_python = start_find_submit_python(os.environ)
        if isinstance(program, str):
            script, words = program, list(args)
        else:
            program = [str(w) for w in program]
            if not program:
                raise UsageError("no script given")
            script, words = program[0], [*program[1:], *args]
        sweep = o["sweep"]
        if isinstance(sweep, Mapping):
            sweep = [f"{k}={','.join(map(str, v))}" for k, v in sweep.items()]
        if sweep and o["params"] is not None:
            raise UsageError("--sweep and --params exclude each other")
        task_args: tuple[tuple[str, ...], ...] = sweep_task_args(list(sweep)) if sweep else ()
        if o["params"] is not None:
            source = Path(str(o["params"]))
            try:
                text = source.read_text()
            except (OSError, UnicodeDecodeError) as exc:
                raise UsageError(f"--params {source}: cannot read it ({exc})") from None
            task_args = params_task_args(text, str(source))
        env = o["env"]
        if isinstance(env, Mapping):
            env = [f"{k}={v}" for k, v in env.items()]
        if self.remote and not self._sync:
            # the code is on the cluster only: the job checks the script there
            program_kind = Program(script, command=not script.endswith(".py"))
        else:
            program_kind = classify(script, self.workdir)
        request = JobRequest(
            script=program_kind.script,
            command=program_kind.command,
            args=tuple(str(w) for w in words),
            gpus=o["gpus"] or 0,  # none: a CPU-only job
            model=o["model"],
            nodes=o["nodes"],
            partition=o["partition"],
            time=o["time"],
            account=o["account"],
            qos=o["qos"],
            cpus_per_gpu=o["cpus_per_gpu"],
            mem_per_gpu=o["mem_per_gpu"],
            job_name=o["job_name"],
            array=o["array"],
            dependency=o["dependency"],
            output=o["output"],
            error=o["error"],
            signal=o["signal"],
            requeue=bool(o["requeue"]),
            max_requeues=o["max_requeues"],
            exclude=o["exclude"],
            nodelist=o["nodelist"],
            mail_type=o["mail_type"],
            mail_user=o["mail_user"],
            constraint=o["constraint"],
            sbatch_args=_words(o["sbatch_args"]),
            gres=_words(o["gres"]),
            project=o["project"],
            tasks_per_node=o["tasks_per_node"],
            launcher=o["launcher"],
            launcher_args=_words(o["launcher_args"]),
            setup=_words(o["setup"]),
            modules=_words(o["modules"]),
            env=_words(env),
            container_image=o["container_image"],
            container_mounts=o["container_mounts"],
            apptainer=o["apptainer"],
            task_args=task_args,
            python=o["python"],
            venv=o["venv"],
            conda=o["conda"],
            token=token,
            snapshot=snapshot,
            retry_bad_node=o["retry_bad_node"],
        )
        if request.dependency and "last" in request.dependency:
            from clusterjob.jobs.submit import expand_dependency

            request = replace(
                request, dependency=expand_dependency(request.dependency, self.registry())
            )
        site = self.site
        avoiding = None
        if o["avoid"] and not self.debug:
            request, avoiding = self._avoided(site, request)
        if submit_python is not None:
            found = submit_python()
            request = replace(request, submit_python=found.python, active_env=found.active_env)
        if self.remote:
            resolved = self._remote_interpreter(
                site, resolve(site, request, choose_interpreter=False)
            )
        else:
            resolved = resolve(site, request)
        if resolved.runs_python and resolved.interpreter is None:
            raise UsageError("no python3 or python on PATH to run the job with: give --python PATH")
        return Prepared(resolved, render(site, resolved), avoiding)

    def avoid_list(self) -> AvoidList:
        """The nodes this user's jobs on this cluster stay off (``jobs/badnodes.py``)."""
        from clusterjob.jobs.badnodes import AvoidList

        return AvoidList(host=self.host)

    def _avoided(self, site: Site, request: JobRequest) -> tuple[JobRequest, str | None]:
        """``request`` with the avoid list's nodes of this cluster added to ``--exclude``, and
        the line that says so (None when none was added). Nothing is asked of Slurm."""
        from clusterjob.jobs.badnodes import merged_exclude

        now = time.time()
        listed = self.avoid_list().entries(site.cluster_name, now)
        if not listed:
            return request, None
        exclude, added = merged_exclude(request.exclude, [e.node for e in listed], request.nodelist)
        if not added:
            return request, None
        told = "; ".join(e.line(now) for e in listed if e.node in added)
        line = f"avoiding {told}; `clusterjob nodes --clear` forgets, --no-avoid ignores"
        return replace(request, exclude=exclude), line

    def _job_options(self, options: Mapping[str, Any]) -> dict[str, Any]:
        """Every job option of one submission: ``options`` over this view's ``options(...)``
        over the defaults of ``clusterjob submit``. ``Cluster(python=...)`` is the jobs' Python
        here too (over ssh it is chosen on the cluster, in ``_remote_interpreter``)."""
        _check_option_names(options)
        merged: dict[str, Any] = {**JOB_OPTIONS, **self._defaults, **options}
        chosen = ("python", "venv", "conda", "container_image", "apptainer")
        if self._python and not self.remote and not any(merged[k] for k in chosen):
            merged["python"] = self._python
        return merged

    def _remote_interpreter(self, site: Site, resolved: ResolvedJob) -> ResolvedJob:
        """The job's Python on the cluster, unchecked here (its files are there): --python,
        --venv, the host profile's python, the partition's then the site's ``job:``, else
        python3 on the login node's PATH."""
        from clusterjob.api.remote import remote_python
        from clusterjob.jobscript.interpreter import Interpreter

        request = resolved.request
        image = request.container_image or request.apptainer
        if request.conda is not None:
            raise UsageError(
                "--conda with --host: give the env's interpreter as --python PATH on the cluster"
            )
        chosen: Interpreter | None = None
        if image is not None:
            chosen = Interpreter(request.python or "python3", f"in the container image {image}")
        elif request.python is not None:
            chosen = Interpreter(request.python, "--python", bin_dir=_bin_dir(request.python))
        elif request.venv is not None:
            python = str(PurePosixPath(request.venv) / "bin" / "python")
            chosen = Interpreter(python, "--venv", venv=request.venv, bin_dir=_bin_dir(python))
        elif self._python is not None:
            chosen = Interpreter(self._python, f"the {self.host} host profile's python",
                                 bin_dir=_bin_dir(self._python))  # fmt: skip
        else:
            for entry, where in (
                (resolved.partition.job, f"partitions.{resolved.partition.name}.job"),
                (site.job, "job"),
            ):
                if entry.python is not None:
                    chosen = Interpreter(entry.python, f"the site's {where} python",
                                         bin_dir=_bin_dir(entry.python))  # fmt: skip
                    break
                if entry.venv is not None:
                    python = str(PurePosixPath(entry.venv) / "bin" / "python")
                    chosen = Interpreter(python, f"the site's {where} venv", venv=entry.venv,
                                         bin_dir=_bin_dir(python))  # fmt: skip
                    break
        if chosen is None and resolved.runs_python:
            assert isinstance(self.transport, SshTransport)
            if self._remote_python is None:
                self._remote_python = remote_python(self.transport) or ""
            if self._remote_python:
                chosen = Interpreter(self._remote_python, f"python3 on {self.host}'s PATH")
        if chosen is None:
            return resolved
        request = replace(request, python=chosen.python, venv=chosen.venv, python_why=chosen.why)
        return replace(resolved, request=request, interpreter=chosen)

    def _snapshot_dir(self, name: str, asked: object) -> str | None:
        """Where a job runs its code from (``JobRequest.snapshot``), or None without
        ``--snapshot``: ``name`` in the data dir here; over ssh, under the job's directory
        there (relative to it). A debug cluster runs the live code. The name is not the job's
        token: ``resubmit --same-script`` gives the script a new token, and the same code."""
        if not (self.snapshot if asked is None else bool(asked)) or self.debug:
            return None
        if not self.remote:
            from clusterjob.jobs.snapshot import snapshot_path

            return str(snapshot_path(name))
        if not self._sync:
            raise UsageError(
                "--snapshot with --host copies the code from here, but this host's code is "
                "not synced from here (sync: false / --no-sync): drop one of them"
            )
        return f"{REMOTE_SNAPSHOTS}/{name}"

    def _take_snapshot(self, request: JobRequest, workdir: str) -> Path | None:
        """Copy the code for ``request``'s job (``jobs/snapshot.py``) where the job will
        read it; over ssh, copied here first and shipped there. The local copy, if kept."""
        from clusterjob.jobs import snapshot as snapshots
        from clusterjob.jobscript.program import snapshot_word

        where = snapshot_word(request.script, request.args, command=request.command)
        words = [request.script, *request.args]
        extra = [os.path.normpath(words[where])] if where is not None else []
        assert request.snapshot is not None
        local = snapshots.take(self.workdir, PurePosixPath(request.snapshot).name, extra)
        if not self.remote:
            return local
        from clusterjob.api.remote import remote_sh
        from clusterjob.slurm import ssh

        assert isinstance(self.transport, SshTransport)
        try:
            remote_sh(self.transport, 'mkdir -p -m 700 -- "$1"', f"{workdir}/{REMOTE_SNAPSHOTS}")
            target = f"{workdir}/{request.snapshot}"
            ssh.run_rsync(ssh.rsync_argv(self.transport.target, local, target, ()),
                          self.transport.target)  # fmt: skip
        finally:
            snapshots.discard(local)
        return None

    def _prune_snapshots(self, workdir: str) -> None:
        """Remove the snapshots no recorded job needs any more (``jobs/snapshot.stale``),
        here or in the job directory on the cluster; never fails a submission."""
        import re

        from clusterjob.jobs import snapshot as snapshots

        with contextlib.suppress(ClusterjobError, OSError):
            records = self.registry().all()
            if not self.remote:
                snapshots.prune(records)
                return
            from clusterjob.api.remote import remote_sh

            assert isinstance(self.transport, SshTransport)
            where = f"{workdir}/{REMOTE_SNAPSHOTS}"
            out = remote_sh(self.transport, _LIST_SNAPSHOTS, where)
            found = []
            for line in out.splitlines():
                made, _, name = line.partition(" ")
                if made.isdigit() and re.fullmatch(r"[A-Za-z0-9_-]+", name):
                    found.append((name, float(made)))
            gone = snapshots.stale(found, records, time.time())
            if gone:
                remote_sh(self.transport, 'cd -- "$1" && shift && rm -rf -- "$@"', where, *gone)

    def _remote_workdir(self) -> str:
        """The job directory on the cluster (created once), synced from ``workdir`` first
        unless ``sync=False``."""
        from clusterjob.api.remote import default_remote_dir, prepare_remote_dir, sync

        assert isinstance(self.transport, SshTransport) and self.profile is not None
        if self._remote_abs is None:
            wanted = self._remote_dir or default_remote_dir(self.workdir)
            self._remote_abs = prepare_remote_dir(self.transport, wanted)
        if self._sync:
            sync(self.profile, self.workdir, self._remote_abs)
        return self._remote_abs

    def submit(
        self,
        program: str | Sequence[str],
        args: Sequence[str] = (),
        *,
        mkdir: bool = False,
        test_only: bool = False,
        command_line: Sequence[str] | None = None,
        **options: Any,
    ) -> Job:
        """Submit a script (``"train.py"``) or a command (``["torchrun", ...]``); the job.
        ``test_only``: use ``submit_test_only``."""
        if test_only:
            raise UsageError("test_only: call submit_test_only(), which returns Slurm's estimate")
        prepared = self.prepare(program, args, **options)
        if self.debug:
            return self._debug_command(prepared, mkdir=mkdir)
        if command_line is None:
            command_line = _api_call("submit", program, args)
        result = _submitted(self.submit_prepared(prepared, mkdir=mkdir, command_line=command_line))
        return Job(self, result.job_id, submitted=result)

    def submit_test_only(
        self, program: str | Sequence[str], args: Sequence[str] = (), **options: Any
    ) -> TestOnlyResult:
        """``sbatch --test-only``: would Slurm take the job, and when would it start."""
        from clusterjob.jobs.submit import TestOnlyResult

        prepared = self.prepare(program, args, **options)
        result = self.submit_prepared(prepared, test_only=True)
        assert isinstance(result, TestOnlyResult)
        return result

    def submit_prepared(
        self,
        prepared: Prepared,
        *,
        test_only: bool = False,
        mkdir: bool = False,
        command_line: Sequence[str] | None = None,
    ) -> Submitted | TestOnlyResult:
        """Send a prepared job to Slurm exactly once (the CLI's ``submit`` ends here). With
        ``--snapshot``, its code is copied first (and the copy removed if no job was made)."""
        from clusterjob.jobs import submit as job_submit
        from clusterjob.jobs.snapshot import discard

        if self.debug:
            raise UsageError(
                "Cluster(debug=True) sends nothing to Slurm: submit(), submit_function() and "
                "map() run the job here"
            )
        request = prepared.resolved.request
        if self.remote:
            workdir = self._remote_workdir()
            if mkdir:
                self._remote_mkdirs(workdir, (request.output, request.error))
            source: Path | None = self.workdir if self._sync else None
        else:
            job_submit.check_output_dirs(request.output, request.error, self.workdir, mkdir=mkdir)
            workdir, source = str(self.workdir), self.workdir
        copied = None
        if request.snapshot and not test_only:
            copied = self._take_snapshot(request, workdir)
        try:
            submitted = self._send(prepared, test_only, workdir, command_line, source)
        except (UsageError, SlurmError) as exc:
            if copied is not None and not isinstance(exc, SubmissionUncertain):
                discard(copied)  # no job was made (a job that may exist keeps it)
            raise
        if request.snapshot and not test_only:
            self._prune_snapshots(workdir)
        return submitted

    def _send(
        self,
        prepared: Prepared,
        test_only: bool,
        workdir: str,
        command_line: Sequence[str] | None,
        source: Path | None,
    ) -> Submitted | TestOnlyResult:
        from clusterjob.jobs import submit as job_submit

        return job_submit.submit(
            self.site,
            prepared.resolved,
            prepared.rendered,
            test_only=test_only,
            client=self.client(),
            registry=self.registry(),
            workdir=workdir,
            command_line=command_line,
            source_dir=source,
        )

    def _remote_mkdirs(self, workdir: str, patterns: Iterable[str | None]) -> None:
        from clusterjob.api.remote import remote_sh

        assert isinstance(self.transport, SshTransport)
        for pattern in patterns:
            directory = os.path.dirname(pattern or "")
            if directory and "%" not in directory:
                remote_sh(self.transport, 'cd -- "$1" && mkdir -p -- "$2"', workdir, directory)

    # --- Python functions as jobs -------------------------------------------------------------

    def submit_function(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        """Run ``fn(*args, **kwargs)`` as a job (options: ``cluster.options(...)``); the job's
        ``result()`` is what it returns, or raises what it raised."""
        return self._function_jobs(fn, [(args, kwargs)], array=False)[0]

    def map(self, fn: Callable[..., Any], *iterables: Iterable[Any]) -> list[Job]:
        """``fn`` over the inputs as ONE array job (one sbatch call); a job per input, each
        task's ``result()`` in the order of the inputs."""
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]]
        calls = [(tuple(a), {}) for a in zip(*iterables, strict=False)]
        if not calls:
            return []
        return self._function_jobs(fn, calls, array=True)

    def executor(self, **options: Any) -> ClusterExecutor:
        """A ``concurrent.futures.Executor`` whose calls are jobs with these options."""
        return ClusterExecutor(self.options(**options))

    def _function_root(self) -> str:
        if self.remote:
            return str(PurePosixPath(self._remote_workdir()) / ".clusterjob" / "functions")
        from clusterjob.jobs.private_files import data_dir

        return str(data_dir() / "functions")

    def _function_jobs(
        self,
        fn: Callable[..., Any],
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        *,
        array: bool,
    ) -> list[Job]:
        from clusterjob.api import worker
        from clusterjob.jobscript.request import new_token

        try:
            import cloudpickle
        except ImportError:
            raise UsageError(
                "function jobs need cloudpickle: pip install 'clusterjob-slurm[api]'"
            ) from None
        if not callable(fn):
            raise UsageError(f"not a function: {fn!r}")
        options = dict(self._defaults)
        token = new_token()
        if self.debug:  # a directory named, never made: the job is checked, then run here
            from clusterjob.jobs.private_files import data_dir

            jobdir = f"{data_dir() / 'functions'}/{token}"
        else:
            jobdir = f"{self._function_root()}/{token}"
        try:
            payload = cloudpickle.dumps((worker.PROTOCOL, fn, calls))
        except Exception as exc:
            raise UsageError(f"cannot pickle {_name(fn)} and its arguments: {exc}") from None
        if not self.debug:
            self.transport.write_bytes(f"{jobdir}/input.pkl", payload)
            worker_file = Path(worker.__file__).read_bytes()
            self.transport.write_bytes(f"{jobdir}/{WORKER_NAME}", worker_file)
        if callable(getattr(fn, "checkpoint", None)):
            options.setdefault("signal", f"B:USR1@{CHECKPOINT_GRACE}")
            options.setdefault("requeue", True)
        if array:
            limit = str(options.get("array") or "")
            if limit and not limit.startswith("%"):
                raise UsageError("map(): give at most array='%N' (how many tasks run at once)")
            options["array"] = f"0-{len(calls) - 1}{limit}"
        # its own directory holds its logs, stdout and stderr apart: ID.out, ID.err
        logs = f"{jobdir}/%A_%a" if array else f"{jobdir}/%j"
        options.setdefault("output", f"{logs}.out")
        options.setdefault("error", f"{logs}.err")
        options.setdefault("job_name", _name(fn))
        chooses = not any(options.get(k) for k in ("python", "venv", "conda"))
        if (
            chooses
            and not self._python
            and not self.remote
            and not (options.get("container_image") or options.get("apptainer"))
        ):
            options["python"] = sys.executable  # the interpreter that pickled the function
        prepared = self.prepare(
            ["python", "-u", f"{jobdir}/{WORKER_NAME}", jobdir], (), token=token, **options
        )
        if self.debug:
            return self._debug_functions(prepared, fn, calls, array=array)
        result = _submitted(
            self.submit_prepared(
                prepared,
                command_line=_api_call("map" if array else "submit_function", _name(fn), ()),
            )
        )
        if not array:
            return [Job(self, result.job_id, submitted=result, jobdir=jobdir, task=0)]
        return [
            Job(self, f"{result.job_id}_{i}", submitted=result, jobdir=jobdir, task=i)
            for i in range(len(calls))
        ]

    # --- debug: the job checked as for Slurm, then run here ------------------------------------

    def _debug_id(self) -> str:
        with self._calls_lock:
            self._debug_ids[0] += 1
            return f"debug-{self._debug_ids[0]}"

    def _debug_command(self, prepared: Prepared, *, mkdir: bool) -> DebugJob:
        """Run a prepared script or command job here, as a child process in the submitting
        directory with this terminal (each array task in turn, with its own
        ``SLURM_ARRAY_TASK_ID`` and sweep arguments); no launcher, setup or container."""
        import shutil
        import subprocess

        from clusterjob.jobs.submit import check_output_dirs
        from clusterjob.slurm.syntax import array_task_ids

        resolved = prepared.resolved
        request = resolved.request
        if not self.remote:
            check_output_dirs(request.output, request.error, self.workdir, mkdir=mkdir)
        chosen = resolved.interpreter.python if resolved.interpreter else None
        python = shutil.which(chosen) if chosen else None
        argv = (
            [python or sys.executable, *resolved.argv] if resolved.runs_python else [*resolved.argv]
        )
        env = {**os.environ, **dict(resolved.env), "CLUSTERJOB_TOKEN": request.token}
        tasks = array_task_ids(request.array) if request.array else [None]
        job_id = self._debug_id()
        started = time.time()
        code = 0
        for task in tasks:
            words = list(argv)
            if task is not None:
                env["SLURM_ARRAY_TASK_ID"] = str(task)
                if request.task_args:
                    words += request.task_args[task]
            try:
                done = subprocess.run(words, cwd=self.workdir, env=env, check=False)
            except OSError as exc:
                raise UsageError(f"debug: cannot run {words[0]}: {exc.strerror}") from None
            code = code or done.returncode
        row = _debug_status(self, job_id, resolved.job_name, code, started)
        job = DebugJob(self, job_id, row)
        job._set(**({"result": row} if code == 0 else {"exception": _failed(job_id, row)}))
        return job

    def _debug_functions(
        self,
        prepared: Prepared,
        fn: Callable[..., Any],
        calls: list[tuple[tuple[Any, ...], dict[str, Any]]],
        *,
        array: bool,
    ) -> list[Job]:
        """Call ``fn`` here for each of ``calls``, in order, as the job's worker would: what it
        returns is the result (it must pickle, as it must in a job), what it raises is
        re-raised by ``result()``."""
        import cloudpickle

        from clusterjob.jobs.submit import check_output_dirs

        output, error = (
            str(v) if v else None for v in map(self._defaults.get, ("output", "error"))
        )
        if not self.remote:  # the directories the user named for -o/-e must exist, as in Slurm
            check_output_dirs(output, error, self.workdir)
        base = self._debug_id()
        jobs: list[Job] = []
        for i, (args, kwargs) in enumerate(calls):
            job_id = f"{base}_{i}" if array else base
            started = time.time()
            outcome: dict[str, Any]
            try:
                value = fn(*args, **kwargs)
                cloudpickle.dumps(value)  # a job's result travels pickled: one that cannot fails
                outcome = {"result": value}
            except (Exception, SystemExit) as exc:
                outcome = {"exception": exc}
            failed = "exception" in outcome
            row = _debug_status(self, job_id, prepared.resolved.job_name, int(failed), started)
            job = DebugJob(self, job_id, row, function=True, task=i)
            job._set(**outcome)
            jobs.append(job)
        return jobs

    # --- the jobs clusterjob submitted --------------------------------------------------------

    def job(self, job_id: str) -> Job:
        """A ``Job`` for a job submitted earlier (an id, ``ID_TASK`` or ``last``). A function
        job's (its record says so) ``result()`` is the function's value, as when submitted."""
        from clusterjob.slurm.syntax import split_array_id

        registry = self.registry()
        resolved = registry.resolve_id(job_id)
        base, task = split_array_id(resolved)
        record = registry.get(base)
        function = _function_job(record) if record is not None else None
        if function is None:
            return Job(self, resolved)
        jobdir, mapped = function
        if mapped and task is None:
            raise UsageError(
                f"job {base} is a map(): one array job whose tasks each have a result; "
                f"name a task, e.g. cluster.job('{base}_0')"
            )
        return Job(self, resolved, jobdir=jobdir, task=int(task) if task else 0)

    def status(
        self, jobs: Sequence[str] = (), *, show_all: bool = False, tasks: bool = False
    ) -> list[JobStatus]:
        """``clusterjob status``: one squeue (and one sacct) call for all the jobs."""
        from clusterjob.jobs.status import status

        rows = status(
            list(jobs),
            show_all=show_all,
            tasks=tasks,
            client=self.client(),
            registry=self.registry(),
            cache=self.cache(),
        )
        if not rows and self.remote:  # a --host that cannot be reached says so, not "no jobs"
            self.client().cluster_name()
        return rows

    def cancel(self, jobs: Sequence[str]) -> list[str]:
        """``clusterjob cancel``: one scancel call; the ids asked to cancel."""
        from clusterjob.jobs.cancel import cancel

        return cancel(
            list(jobs), client=self.client(), registry=self.registry(), cache=self.cache()
        )

    def wait(
        self, jobs: Sequence[str], *, timeout: float | None = None, interval: float = 10.0
    ) -> WaitResult:
        """``clusterjob wait``: poll until the jobs end (or ``timeout``). A function job's
        end is seen by its result file (its marker) within a second or two, and Slurm asked
        then how it ended, instead of after ``interval``."""
        from clusterjob.jobs.wait import wait

        registry = self.registry()
        markers = self._function_tasks(jobs, registry)
        return wait(
            list(jobs),
            timeout=timeout,
            interval=interval,
            client=self.client(),
            registry=registry,
            cache=self.cache(),
            ending=self._ending(markers) if markers else None,
            follow=lambda row: self.bad_node_follow(row, registry),
        )

    def bad_node_follow(
        self, row: JobStatus, registry: Registry | None = None
    ) -> tuple[str | None, str | None]:
        """What an ended job says of its nodes (``jobs/badnodes.py``): its bad nodes recorded
        in the avoid list and, for a job of ``--retry-bad-node N`` with retries left that did
        not complete, the job submitted again without them. (The new job's id or None, the
        line that says what was done or None.) The retry's token is derived from the job's,
        so two waiters, or a retry whose sbatch timed out, make one job: the registry and
        squeue are asked for it before anything is submitted."""
        from clusterjob.jobs import badnodes
        from clusterjob.slurm.syntax import split_array_id

        registry = registry or self.registry()
        base, task = split_array_id(row.job_id)
        record = registry.get(base)
        if record is None or task is not None or row.tasks_summary:
            return None, None  # not ours, or an array: its tasks end each their own way
        log = self._log_for_findings(row, record)
        found = badnodes.findings(row.state, row.exit_code, row.nodes, row.hardware, log)
        if not found:
            return None, None
        cluster = row.cluster or record.cluster
        self.avoid_list().add(found, cluster=cluster, job_id=row.job_id)
        what = "; ".join(f"{node}: {finding}" for node, finding in found)
        said = f"{row.job_id}: {what}; your submissions avoid it for {badnodes.DEFAULT_HOURS:g}h"
        retries = _retries_left(record)
        if row.state == "COMPLETED" or retries <= 0:
            return None, said
        with _RETRYING:  # one thread of this process at a time; other processes: the token
            return self._retry_once(row, record, found, said, retries, registry)

    def _retry_once(
        self,
        row: JobStatus,
        record: JobRecord,
        found: list[tuple[str, str]],
        said: str,
        retries: int,
        registry: Registry,
    ) -> tuple[str | None, str | None]:
        from clusterjob.errors import RegistryError
        from clusterjob.jobs import badnodes

        cluster = row.cluster or record.cluster
        token = badnodes.retry_token(record.token)
        again = registry.by_token(token)  # submitted by another waiter here
        if again is not None:
            return again.job_id, f"{said}; its retry is job {again.job_id}"
        queued = self.client().find_jobs_by_comment(token)  # or elsewhere, or its record lost
        if queued:
            return queued[0].job_id, f"{said}; its retry is job {queued[0].job_id}"
        nodes = [n for n, _ in found]
        avoided = [e.node for e in self.avoid_list().entries(cluster)]
        try:
            submitted = self.resubmit_avoiding(row.job_id, [*nodes, *avoided], token)
        except UsageError as exc:  # e.g. the node is the one its --nodelist names
            return None, f"{said}; not submitted again: {exc}"
        except RegistryError:  # another waiter recorded the same retry a moment ago
            other = _recorded_id(registry, token)
            if other is None:
                raise
            return other, f"{said}; its retry is job {other}"
        left = retries - 1
        return submitted.job_id, (
            f"{said}; submitted again as job {submitted.job_id} without "
            f"{', '.join(dict.fromkeys(nodes))} (--retry-bad-node: {left} more left)"
        )

    def resubmit_avoiding(self, job: str, nodes: Sequence[str], token: str) -> Submitted:
        """``job`` again, its script as it was, with ``nodes`` excluded and one
        ``--retry-bad-node`` spent (``jobs.submit.resubmit_elsewhere``)."""
        from clusterjob.jobs.submit import resubmit_elsewhere

        return resubmit_elsewhere(job, nodes, token, client=self.client(), registry=self.registry())

    def _log_for_findings(self, row: JobStatus, record: JobRecord) -> str | None:
        """The job's output, where its preflight's verdict may be: a job that exited
        ``PREFLIGHT_EXIT``, or one of a ``preflight: warn`` site (which went on). Other jobs'
        logs are not read."""
        from clusterjob.jobscript.requeues import PREFLIGHT_EXIT

        warned = "this site's preflight is warn" in record.script
        if row.exit_code != PREFLIGHT_EXIT and not warned:
            return None
        texts: list[str] = []
        for stderr in (False, True):
            with contextlib.suppress(ClusterjobError, OSError):
                text = self.read_log(self.output_path(row.job_id, stderr=stderr))
                if text and text not in texts:
                    texts.append(text)
        return "\n".join(texts) or None

    def _function_tasks(
        self, jobs: Sequence[str], registry: Registry
    ) -> dict[str, list[tuple[str, int]]]:
        """The function jobs among ``jobs`` (by the id ``status`` shows them under): each
        one's (job directory, task) pairs, all of a ``map``'s tasks for its own id."""
        from clusterjob.jobs.status import array_spec
        from clusterjob.slurm.syntax import array_task_ids, split_array_id

        found: dict[str, list[tuple[str, int]]] = {}
        for name in jobs:
            try:
                job_id = registry.resolve_id(name)
            except UsageError:
                continue  # wait() itself says what is wrong with it
            base, task = split_array_id(job_id)
            record = registry.get(base)
            function = _function_job(record) if record is not None else None
            if record is None or function is None:
                continue
            jobdir, mapped = function
            if task is not None:
                tasks = [int(task)]
            elif mapped:
                spec = array_spec(record.script)
                tasks = array_task_ids(spec) if spec else []
            else:
                tasks = [0]
            if tasks:
                found[job_id] = [(jobdir, t) for t in tasks]
        return found

    def _ending(
        self, markers: Mapping[str, list[tuple[str, int]]]
    ) -> Callable[[Sequence[str], float], list[str]]:
        """``jobs.wait``'s ``ending``: which of the ids have left every task's result file,
        waiting up to ``within`` seconds (over ssh, one round trip) for that."""
        from clusterjob.api.polling import finished_tasks

        seen: set[tuple[str, int]] = set()

        def ending(ids: Sequence[str], within: float) -> list[str]:
            end = time.monotonic() + within
            while True:
                wanted: dict[str, set[int]] = {}
                for job_id in ids:
                    for jobdir, task in markers.get(job_id, ()):
                        if (jobdir, task) not in seen:
                            wanted.setdefault(jobdir, set()).add(task)
                left = max(0.0, end - time.monotonic())
                if wanted:
                    seen.update(finished_tasks(self.transport, wanted, within=left))
                else:
                    time.sleep(left)
                done = [i for i in ids if i in markers and all(p in seen for p in markers[i])]
                if done or time.monotonic() >= end:
                    return done

        return ending

    def resubmit(
        self,
        job: str,
        *,
        changes: object = None,
        same_script: bool = False,
        failed: bool = False,
    ) -> Submitted:
        """``clusterjob resubmit``: a recorded job again, re-rendered with today's site (and
        ``changes``, a ``clusterjob.jobs.submit.Changes``) or ``same_script``; ``job`` as
        ``ID_TASK``: that task of an array alone; ``failed``: an array's tasks that did not
        complete, as one new array. Over ssh the job runs from its recorded directory there
        (nothing is synced) with its Python chosen on the cluster."""
        from clusterjob.jobs.submit import Changes, resubmit, tracked

        if self.debug:
            raise UsageError("Cluster(debug=True) sends nothing to Slurm: it resubmits nothing")
        assert changes is None or isinstance(changes, Changes)
        # a job clusterjob never submitted is refused before the site is read (with no site
        # file, reading it describes the live cluster first)
        tracked(self.registry(), job, self.client())
        return resubmit(
            job,
            site=None if same_script else self.site,
            changes=changes,
            same_script=same_script,
            failed=failed,
            client=self.client(),
            registry=self.registry(),
            interpreter=self._remote_interpreter if self.remote else None,
        )

    def provenance(self, job: str) -> dict[str, object]:
        """``clusterjob show``: where a job came from."""
        from clusterjob.jobs.submit import provenance

        return provenance(job, registry=self.registry(), client=self.client())

    def output_path(self, job: str, *, stderr: bool = False, task: int | None = None) -> Path:
        """Where the job writes its output (on the cluster's file system)."""
        from clusterjob.jobs.logs import output_path

        return output_path(
            job, stderr=stderr, task=task, client=self.client(), registry=self.registry()
        )

    def read_log(self, path: Path) -> str | None:
        """A job's file as text; None while it does not exist (read over ssh if remote)."""
        from clusterjob.jobs.logs import read_text

        return read_text(path, self.transport.read_bytes)

    def logs(self, job: str, *, stderr: bool = False, task: int | None = None) -> str:
        """``clusterjob logs``: what the job has written so far."""
        path = self.output_path(job, stderr=stderr, task=task)
        text = self.read_log(path)
        if text is None:
            raise UsageError(f"{path} does not exist (yet): the job may not have started")
        return text

    def follow(
        self, job: str, *, stderr: bool = False, task: int | None = None, poll: float | None = None
    ) -> Iterator[str]:
        """``clusterjob logs -f``: the output as it is written, until the job ends."""
        from clusterjob.jobs.logs import follow, is_finished

        path = self.output_path(job, stderr=stderr, task=task)
        name = job if task is None else f"{job}_{task}"
        registry = self.registry()
        name = registry.resolve_id(name) if task is None else name
        return follow(
            path,
            finished=lambda: is_finished(
                name, client=self.client(), registry=registry, cache=self.cache()
            ),
            poll=poll if poll is not None else (1.0 if self.remote else 0.5),
            read=self.transport.read_bytes,
        )

    def shell(
        self, command: Sequence[str] = (), *, dry_run: bool = False, **options: Any
    ) -> int | str:
        """``clusterjob shell``: an interactive ``srun --pty`` session (on this terminal);
        its exit status, or (``dry_run``) the command line. Its keywords are the options of
        ``clusterjob shell``; of this view's ``options(...)``, those same ones apply."""
        from clusterjob.jobs.interactive import open_shell, shell_session
        from clusterjob.jobscript.request import JobRequest, resolve

        unknown = sorted(set(options) - set(SHELL_OPTIONS))
        if unknown:
            raise UsageError(
                f"unknown shell option {unknown[0]!r} (the options of clusterjob shell, with _ "
                f"for -: {', '.join(SHELL_OPTIONS)})"
            )
        given = {k: v for k, v in {**self._defaults, **options}.items() if k in SHELL_OPTIONS}
        request = JobRequest(
            script="shell",
            command=True,
            gpus=given.pop("gpus", None) or 0,
            job_name=given.pop("job_name", None) or "shell",
            **given,
        )
        site = self.site
        job = resolve(site, request, choose_interpreter=False)  # the session runs no script
        session = shell_session(site, job, tuple(command))
        if self.remote:
            remote_site = _fetched_from(Path(site.source), self.host)
            env = dict(session.env)
            if remote_site:
                env["CLUSTERJOB_SITE"] = remote_site
            else:
                env.pop("CLUSTERJOB_SITE", None)
            session = replace(session, env=env)
        if dry_run:
            return session.command_line()
        return open_shell(session, self.client())


def _submitted(result: Submitted | TestOnlyResult) -> Submitted:
    from clusterjob.jobs.submit import Submitted

    assert isinstance(result, Submitted)
    return result


def _fetched_from(path: Path, host: str) -> str | None:
    """The path on the cluster a cached site copy was fetched from (its first line)."""
    try:
        with path.open() as f:
            first = f.readline()
    except OSError:
        return None
    marker = f"# fetched from {host}:"
    if not first.startswith(marker):
        return None
    return first[len(marker) :].rsplit(" by clusterjob", 1)[0] or None


def _bin_dir(python: str) -> str | None:
    parent = str(PurePosixPath(python).parent)
    return parent if python.startswith("/") and parent != "/" else None


def _words(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value)  # type: ignore[attr-defined]


def _name(fn: Callable[..., Any]) -> str:
    name = getattr(fn, "__name__", None) or type(fn).__name__
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name) or "function"


_RETRYING = threading.Lock()  # a --retry-bad-node retry is looked for and sent by one thread


def _recorded_id(registry: Registry, token: str, within: float = 120.0) -> str | None:
    """The job id of the submission recorded with ``token``, waiting up to ``within``
    seconds while its sbatch (another waiter's) has not answered yet; None: no such one."""
    end = time.monotonic() + within
    while True:
        record = registry.by_token(token)
        if record is not None:
            return record.job_id
        waiting = any(p.token == token for p in registry.pending())
        if not waiting or time.monotonic() >= end:
            return None
        time.sleep(0.2)


def _retries_left(record: JobRecord) -> int:
    """The ``--retry-bad-node`` retries a recorded job has left (0 for an older record)."""
    import json

    try:
        data = json.loads(record.request or "{}")
    except ValueError:
        return 0
    value = data.get("retry_bad_node") if isinstance(data, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _check_option_names(options: Mapping[str, object]) -> None:
    unknown = sorted(set(options) - set(JOB_OPTIONS))
    if unknown:
        raise UsageError(
            f"unknown job option {unknown[0]!r} (the options of clusterjob submit, with _ for "
            f"-: {', '.join(JOB_OPTIONS)})"
        )


# --- jobs as futures ----------------------------------------------------------------------------


class Job(concurrent.futures.Future):  # type: ignore[type-arg]
    """A submitted job, and a ``concurrent.futures.Future`` of its outcome.

    ``result()``: a function job's return value (or the exception it raised, re-raised with
    the job's traceback as its ``__cause__``); a command job's final ``JobStatus`` when it
    COMPLETED. A job that ended otherwise raises ``JobFailed``. ``stdout()``, ``stderr()``:
    what it wrote so far.
    """

    # what set the outcome: "marker" (a function job's result file, seen before Slurm said
    # the job ended) or "slurm" (Slurm's state; the result file read then)
    settled_by: str | None = None

    def __init__(
        self,
        cluster: Cluster,
        job_id: str,
        *,
        submitted: Submitted | None = None,
        jobdir: str | None = None,
        task: int | None = None,
    ) -> None:
        super().__init__()
        self.cluster = cluster
        self.id = job_id
        self.submitted = submitted
        self.jobdir = jobdir  # a function job's directory (input, worker, results, logs)
        self.task = task
        self.last_status: JobStatus | None = None
        self.retries: list[str] = []  # what --retry-bad-node did (bad_node_follow's lines)
        self._followed: set[str] = set()
        self._completed_without_result: float | None = None
        self._ended_without_code: float | None = None
        self._added = time.monotonic()
        self._slurm_due = self._added + first_slurm_look(
            marker=jobdir is not None,
            found_again=submitted is None,
            poll_interval=cluster.poll_interval,
        )
        cluster._poller.add(self)

    @property
    def job_id(self) -> str:
        return self.id

    @property
    def is_function(self) -> bool:
        return self.jobdir is not None

    def __repr__(self) -> str:
        state = self.last_status.state if self.last_status else "?"
        return f"<Job {self.id} {state}{' on ' + self.cluster.host if self.cluster.host else ''}>"

    # --- Slurm's view ---

    def status(self) -> JobStatus:
        """The job's status now (one batched query, shared through the status cache)."""
        (row,) = self.cluster.status([self.id])
        self.last_status = row
        return row

    def state(self) -> str:
        """``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``CANCELLED``, ..."""
        return self.status().state

    def running(self) -> bool:
        return self.last_status is not None and self.last_status.state == "RUNNING"

    def wait(self, timeout: float | None = None) -> JobStatus:
        """Block until the job ends; its final status (whatever the state), or its PENDING
        one when it will never start. ``JobTimeout`` (a ``TimeoutError``) when it is still
        going after ``timeout`` seconds."""
        end = None if timeout is None else time.monotonic() + timeout
        self.cluster._poller.wake()
        done, _ = concurrent.futures.wait([self], timeout=timeout)
        if not done:
            raise JobTimeout(f"job {self.id} still {self._shown_state()} after {timeout:g}s")
        if self.settled_by == "marker" and not self.cancelled():
            return self._final_status(end, timeout)
        if self.last_status is None or self.cancelled():
            return self.status()  # cancelled here: Slurm's word on how it ended
        return self.last_status

    def _final_status(self, end: float | None, timeout: float | None) -> JobStatus:
        """Slurm's word on how a job ended whose result came from its marker: the worker
        has just exited, so it is asked again soon (past the status cache, whose answer
        predates the marker), backing off, until it shows the end."""
        from clusterjob.jobs.status import StatusCache, status
        from clusterjob.jobs.wait import EXIT_CODE_GRACE, ended

        fresh = StatusCache(host=self.cluster.host, ttl=0)  # still shares what it learns
        pause, first_end = 0.25, None
        while True:
            (row,) = status([self.id], client=self.cluster.client(),
                            registry=self.cluster.registry(), cache=fresh)  # fmt: skip
            self.last_status = row
            now = time.monotonic()
            if ended(row):
                first_end = first_end or now
                if row.exit_code is not None or row.state == "COMPLETED":
                    return row
                if now - first_end >= EXIT_CODE_GRACE:  # no accounting: the end is final
                    return row
            if end is not None and now >= end:
                raise JobTimeout(f"job {self.id} still {row.state} after {timeout:g}s")
            time.sleep(pause if end is None else max(0.0, min(pause, end - now)))
            pause = min(2 * pause, self.cluster.poll_interval)

    def _shown_state(self) -> str:
        return self.last_status.state if self.last_status else "PENDING"

    def result(self, timeout: float | None = None) -> Any:
        return self._waited(super().result, timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        exc: BaseException | None = self._waited(super().exception, timeout)
        return exc

    def _waited(self, get: Callable[[float | None], Any], timeout: float | None) -> Any:
        """``get(timeout)`` with the poller woken first; a job still running when the
        timeout passes is a JobTimeout naming its state."""
        self.cluster._poller.wake()
        try:
            return get(timeout)
        except concurrent.futures.TimeoutError:
            if self.done():
                raise
            raise JobTimeout(
                f"job {self.id} still {self._shown_state()} after {timeout:g}s"
            ) from None

    def cancel(self) -> bool:
        """Cancel the job in Slurm (``scancel``); False when it had already ended."""
        if self.done():
            return False
        with contextlib.suppress(UsageError):  # Slurm forgot it: nothing left to cancel
            self.cluster.cancel([self.id])
        return super().cancel()

    def logs(self, *, stderr: bool = False) -> str:
        """What the job has written so far (its stdout, or ``stderr``)."""
        return self.cluster.logs(self.id, stderr=stderr)

    def stdout(self) -> str | None:
        """What the job has written to its standard output so far; None while that file
        does not exist (the job has not started). A function job's is ``JOBDIR/ID.out`` in
        its own directory, read without asking Slurm where it is."""
        return self._output(stderr=False)

    def stderr(self) -> str | None:
        """As ``stdout()``, the standard error (a function job's ``JOBDIR/ID.err``: the
        traceback of what it raised is there)."""
        return self._output(stderr=True)

    def _output(self, *, stderr: bool) -> str | None:
        if self.jobdir is not None:
            name = f"{self.id}.{'err' if stderr else 'out'}"
            text = self.cluster.read_log(Path(self.jobdir) / name)
            if text is not None:
                return text
        # a command job, or a function job submitted by a clusterjob that named it otherwise
        return self.cluster.read_log(self.cluster.output_path(self.id, stderr=stderr))

    def follow(self, *, stderr: bool = False) -> Iterator[str]:
        """The job's output as it is written, until it ends."""
        return self.cluster.follow(self.id, stderr=stderr)

    # --- settling (the poller) ---

    def _settle(self, row: JobStatus, now: float) -> None:
        """Record what Slurm said; once the job has ended (or will never start), set the
        future's outcome."""
        from clusterjob.jobs.wait import EXIT_CODE_GRACE, ended, never_starts

        self.last_status = row
        if not self.done() and never_starts(row):
            message = f"job {self.id} will never start ({row.reason}): {row.explanation}"
            self._set(exception=JobFailed(message, row.state))
            return
        if self.done() or not ended(row):
            return
        outcome = self._read_result() if self.is_function else None
        if outcome is not None:  # the function's own word: returned, or raised
            self._set(**outcome)
            return
        no_code = row.exit_code is None and row.source == "squeue"
        if row.state not in ("COMPLETED", "UNKNOWN") and no_code:
            # sacct has not got the exit code yet: wait for it as `wait` does, a while
            if self._ended_without_code is None:
                self._ended_without_code = now
            if now - self._ended_without_code < EXIT_CODE_GRACE:
                return
        if not self.is_function:
            if self._followed_to_retry(row):
                return
            if row.state == "COMPLETED":
                self._set(result=row)
            else:
                self._set(exception=_failed(self.id, row))
            return
        if row.state == "COMPLETED":
            first = self._completed_without_result
            if first is None or now - first < RESULT_GRACE:
                self._completed_without_result = first or now
                return  # a shared file system may show the result a moment later
        elif self._followed_to_retry(row):  # its retry runs the same input in the same
            return  # directory and writes the result file this Job reads
        self._set(exception=self._no_result(row))

    def _followed_to_retry(self, row: JobStatus) -> bool:
        """A job's end (a command's, or a function's that left no result) read for bad nodes
        once (``Cluster.bad_node_follow``); with
        ``retry_bad_node`` left, this Job becomes the retry submitted without the node (its
        id changes; ``retries`` says what was done) and waits on. True then."""
        if row.job_id in self._followed:
            return False
        self._followed.add(row.job_id)
        try:
            new_id, note = self.cluster.bad_node_follow(row)
        except ClusterjobError as exc:
            self.retries.append(f"{row.job_id}: not submitted again: {exc}")
            return False
        if note:
            self.retries.append(note)
        if new_id is None:
            return False
        self.id = new_id
        self._ended_without_code = None
        return True

    def _set(
        self, *, result: Any = None, exception: BaseException | None = None, by: str = "slurm"
    ) -> None:
        if not self.done():
            self.settled_by = by
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                self.set_exception(exception)
            else:
                self.set_result(result)

    def _settle_from_marker(self) -> int:
        """Settle the job from the result file its marker showed (read and checked as
        ``_read_result`` does): 1 when it did, 0 when there was nothing to read after all."""
        if self.done():
            return 0
        outcome = self._read_result()
        if outcome is None:
            return 0
        self._set(**outcome, by="marker")
        return 1

    def _read_result(self) -> dict[str, Any] | None:
        """The function's outcome from its result file, unpickled only if the file (and the
        functions directory it is in) could have been written by no one but this user and it
        is this job's and task's own; None while there is none."""
        import cloudpickle

        from clusterjob.api.remote import read_own_bytes
        from clusterjob.api.worker import result_header

        assert self.jobdir is not None
        path = f"{self.jobdir}/result-{self.task or 0}.pkl"
        try:  # .../functions/TOKEN/result-I.pkl: the file and its 3 directories
            data = read_own_bytes(self.cluster.transport, path, 3)
        except ClusterjobError as exc:
            return {"exception": JobFailed(f"job {self.id}: result not read: {exc}")}
        if data is None:
            return None
        header = result_header(PurePosixPath(self.jobdir).name, self.task or 0)
        if not data.startswith(header):
            found = data.split(b"\n", 1)[0][:120].decode("utf-8", "replace")
            return {
                "exception": JobFailed(
                    f"job {self.id}: refusing {path}: not this job's result (it starts "
                    f"{found!r}, expected {header.decode().strip()!r}); not unpickled"
                )
            }
        try:
            record = cloudpickle.loads(data[len(header) :])
        except Exception as exc:  # e.g. the value's class cannot be imported here
            return {
                "exception": JobFailed(f"job {self.id}: its result cannot be unpickled here: {exc}")
            }
        if record[0] == "ok":
            return {"result": record[1]}
        _, raised, text, shown = record
        if isinstance(raised, BaseException):
            raised.__cause__ = RemoteTraceback(text)
            return {"exception": raised}
        failed = JobFailed(f"job {self.id}: the function raised {shown}", "FAILED")
        failed.__cause__ = RemoteTraceback(text)
        return {"exception": failed}

    def _no_result(self, row: JobStatus) -> JobFailed:
        assert self.jobdir is not None
        note = self.cluster.transport.read_bytes(f"{self.jobdir}/error-{self.task or 0}.txt")
        if note:
            return JobFailed(note.decode("utf-8", "replace").strip(), row.state, row.exit_code)
        why = f"ended {row.state}" + (f" (exit {row.exit_code})" if row.exit_code else "")
        return JobFailed(
            f"job {self.id} {why} without a result from its function; see job.logs()",
            row.state,
            row.exit_code,
        )


class DebugJob(Job):
    """A job of ``Cluster(debug=True)``: checked as for Slurm, then run here when it was
    submitted. The interface of ``Job``: ``result()`` (a function's value, or its exception
    re-raised; a command's final status, or ``JobFailed``), ``done()``, ``status()``,
    ``state()``, ``wait()``; its id is ``debug-N`` (a ``map`` task ``debug-N_I``). Its output
    went to this process's own stdout and stderr."""

    def __init__(
        self,
        cluster: Cluster,
        job_id: str,
        row: JobStatus,
        *,
        function: bool = False,
        task: int | None = None,
    ) -> None:
        concurrent.futures.Future.__init__(self)  # no poller: there is nothing to ask Slurm
        self.cluster = cluster
        self.id = job_id
        self.submitted = None
        self.jobdir = None
        self.task = task
        self.last_status = row
        self._function = function
        self._completed_without_result = None
        self._ended_without_code = None
        self._added = self._slurm_due = time.monotonic()

    @property
    def is_function(self) -> bool:
        return self._function

    def status(self) -> JobStatus:
        assert self.last_status is not None
        return self.last_status

    def wait(self, timeout: float | None = None) -> JobStatus:
        return self.status()

    def _waited(self, get: Callable[[float | None], Any], timeout: float | None) -> Any:
        return get(timeout)

    def cancel(self) -> bool:
        return False  # it ran when it was submitted

    def logs(self, *, stderr: bool = False) -> str:
        raise UsageError(f"{self.id} ran here: its output went to this process's stdout/stderr")

    def _output(self, *, stderr: bool) -> str | None:
        return self.logs(stderr=stderr)  # stdout(), stderr(): there is no file to read

    def follow(self, *, stderr: bool = False) -> Iterator[str]:
        return iter([self.logs(stderr=stderr)])


def _debug_status(cluster: Cluster, job_id: str, name: str, code: int, started: float) -> JobStatus:
    """A debug job's status, in the form Slurm's would have."""
    import datetime
    import socket

    from clusterjob.jobs.status import JobStatus

    seconds = int(time.time() - started)
    return JobStatus(
        job_id=job_id,
        cluster="",
        name=name,
        state="COMPLETED" if code == 0 else "FAILED",
        reason=None,
        explanation="" if code == 0 else "it ran here (debug) and failed",
        nodes=socket.gethostname(),
        elapsed=f"{seconds // 3600:02d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}",
        exit_code=code,
        submitted=datetime.datetime.fromtimestamp(started).isoformat(timespec="seconds"),
        site=cluster.site.name,
        source="debug",
    )


def _failed(job_id: str, row: JobStatus) -> JobFailed:
    code = f" (exit {row.exit_code})" if row.exit_code not in (None, 0) else ""
    why = f": {row.explanation}" if row.explanation else ""
    return JobFailed(f"job {job_id} ended {row.state}{code}{why}", row.state, row.exit_code)


_POLLERS: weakref.WeakSet[_Poller] = weakref.WeakSet()
STOP_JOIN_SECONDS = 30.0  # how long stop_polling waits for a refresh under way to end


def stop_polling() -> None:
    """End every cluster's polling thread (its futures are left as they are). For a program
    that is done waiting, and for tests: a thread left polling one test's jobs would ask the
    next test's Slurm about them."""
    pollers = list(_POLLERS)
    for poller in pollers:
        poller.stop()
    for poller in pollers:  # a refresh under way finishes first (it may write the registry)
        poller.join(timeout=STOP_JOIN_SECONDS)


class _Poller:
    """One thread per cluster that settles its unfinished jobs. A function job's result file
    (its marker) is looked for often, one directory listing per job directory here, or one
    ssh round trip for all of them (``polling.finished_tasks``); Slurm is asked in ONE status
    query for all the jobs (one squeue, one sacct, or none from the status cache) when any
    of them is due: a command job every ``poll_interval``, a function job at a backing-off
    interval (``polling.slurm_interval``), to notice one that died without a result."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.last_error: ClusterjobError | None = None
        self._stopped = False
        _POLLERS.add(self)

    def stop(self) -> None:
        """End the thread; its jobs stay unsettled (``stop_polling``)."""
        with self._lock:
            self._stopped = True
            self._jobs = []
        self._wake.set()

    def join(self, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, for a stopped thread to end."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def add(self, job: Job) -> None:
        with self._lock:
            self._jobs.append(job)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run,
                    name=f"clusterjob-poller{'-' + self.cluster.host if self.cluster.host else ''}",
                    daemon=True,
                )
                self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def pending(self) -> list[Job]:
        with self._lock:
            self._jobs = [j for j in self._jobs if not j.done()]
            return list(self._jobs)

    def _run(self) -> None:
        from clusterjob.api.polling import REMOTE_HOLD, marker_interval

        markers_due = 0.0
        woken = False
        while not self._stopped:
            jobs = self.pending()
            if not jobs:
                with self._lock:
                    if not [j for j in self._jobs if not j.done()]:
                        self._thread = None
                        return
                continue
            now = time.monotonic()
            if woken:  # someone waits: a look at the markers now, and Slurm's for a command job
                markers_due = now
                for job in jobs:
                    if not job.is_function:
                        job._slurm_due = now
            try:
                functions = [j for j in jobs if j.is_function]
                if functions and now >= markers_due:
                    slurm_due = min(j._slurm_due for j in jobs)
                    hold = min(REMOTE_HOLD, max(0.0, slurm_due - now)) if self.cluster.remote else 0
                    cpu = time.thread_time()
                    self.look_for_markers(functions, within=hold)
                    look_cpu = time.thread_time() - cpu
                    youngest = min(time.monotonic() - j._added for j in functions)
                    markers_due = time.monotonic() + (
                        0 if hold else marker_interval(youngest, look_cpu)
                    )
                jobs = self.pending()
                now = time.monotonic()
                if jobs and min(j._slurm_due for j in jobs) <= now:
                    self.refresh(jobs)
                self.last_error = None
            except ClusterjobError as exc:  # Slurm or ssh down for a while: try again later
                self.last_error = exc
                for job in jobs:  # and not in a loop meanwhile
                    job._slurm_due = max(job._slurm_due, now + self.cluster.poll_interval)
                markers_due = max(markers_due, now + self.cluster.poll_interval)
            except Exception as exc:  # a bug must not leave the futures hanging forever
                for job in jobs:
                    job._set(exception=exc)
            jobs = self.pending()
            if not jobs:
                continue
            due = min(j._slurm_due for j in jobs)
            if any(j.is_function for j in jobs):
                due = min(due, markers_due)
            woken = self._wake.wait(max(0.0, due - time.monotonic()))
            self._wake.clear()

    def look_for_markers(self, jobs: Sequence[Job], *, within: float = 0.0) -> int:
        """Settle the function jobs whose result file is there (read and checked as when
        Slurm says they ended); how many. ``within``: over ssh, wait up to that long on
        the login node for one to appear."""
        from clusterjob.api.polling import finished_tasks

        wanted: dict[str, set[int]] = {}
        for job in jobs:
            if job.jobdir is not None:
                wanted.setdefault(job.jobdir, set()).add(job.task or 0)
        found = finished_tasks(self.cluster.transport, wanted, within=within)
        settled = 0
        for job in jobs:
            if job.jobdir is not None and (job.jobdir, job.task or 0) in found:
                settled += job._settle_from_marker()
        return settled

    def refresh(self, jobs: Sequence[Job]) -> None:
        """One status query for ``jobs`` (arrays asked for by their own id, with tasks)."""
        from clusterjob.api.polling import slurm_interval
        from clusterjob.slurm.syntax import split_array_id

        ids = sorted({split_array_id(j.id)[0] for j in jobs})
        rows = _status_rows(self.cluster, ids)
        self.refreshes += 1
        after = time.monotonic()
        for job in jobs:  # asked now: each job's next look, by its age and kind
            age = after - job._added
            job._slurm_due = after + slurm_interval(
                age, self.cluster.poll_interval, marker=job.is_function
            )
        by_id: dict[str, JobStatus] = {}
        for row in rows:
            by_id[row.job_id] = row
            for task in row.tasks:
                by_id[task.job_id] = task
        now = time.monotonic()
        for job in jobs:
            found = by_id.get(job.id)
            if found is not None:
                job._settle(found, now)


def _status_rows(cluster: Cluster, ids: list[str]) -> list[JobStatus]:
    from clusterjob.jobs.status import status

    try:
        return status(
            ids,
            tasks=True,
            client=cluster.client(),
            registry=cluster.registry(),
            cache=cluster.cache(),
        )
    except SlurmError:
        raise
    except UsageError:
        # one id Slurm no longer knows (and clusterjob did not submit): ask one by one
        rows: list[JobStatus] = []
        for job_id in ids:
            with contextlib.suppress(UsageError):
                rows += status([job_id], tasks=True, client=cluster.client(),
                               registry=cluster.registry(), cache=cluster.cache())  # fmt: skip
        return rows


class ClusterExecutor(concurrent.futures.Executor):
    """``concurrent.futures.Executor`` over a cluster: ``submit(fn, ...)`` is a job,
    ``map(fn, ...)`` one array job (results in order, as ``Executor.map``)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._jobs: list[Job] = []
        self._shutdown = False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Job:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        job = self.cluster.submit_function(fn, *args, **kwargs)
        self._jobs.append(job)
        return job

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Iterator[Any]:
        if self._shutdown:
            raise RuntimeError("cannot submit after shutdown")
        jobs = self.cluster.map(fn, *iterables)
        self._jobs += jobs
        end = None if timeout is None else time.monotonic() + timeout

        def results() -> Iterator[Any]:
            for job in jobs:
                yield job.result(None if end is None else max(0.0, end - time.monotonic()))

        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._shutdown = True
        if cancel_futures:
            for job in self._jobs:
                job.cancel()
        if wait:
            concurrent.futures.wait(self._jobs)


def _function_job(record: JobRecord) -> tuple[str, bool] | None:
    """(its directory, whether it is a ``map``) when ``record`` is a function job's: the API
    submitted it and its request runs the worker (``python -u DIR/WORKER DIR``, as
    ``_function_jobs`` writes it); None for any other job."""
    import json
    import shlex

    try:
        request = json.loads(record.request or "{}")
        words = shlex.split(record.command_line)
    except ValueError:
        return None
    args = request.get("args") if isinstance(request, dict) else None
    _, api, method = words[0].rpartition(": clusterjob.Cluster.") if words else ("", "", "")
    if not api or method not in ("submit_function", "map"):
        return None
    if not (isinstance(args, list) and len(args) == 3 and all(isinstance(a, str) for a in args)):
        return None
    jobdir = args[2]
    if args[:2] != ["-u", f"{jobdir}/{WORKER_NAME}"]:
        return None
    return jobdir, method == "map"


def _api_call(method: str, program: str | Sequence[str], args: Sequence[str]) -> list[str]:
    """How the registry shows an API submission (``show``'s command line)."""
    words = [program] if isinstance(program, str) else list(program)
    return [f"{Path(sys.argv[0]).name or 'python'}: clusterjob.Cluster.{method}", *words, *args]
