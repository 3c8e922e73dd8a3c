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
about ALL its unfinished jobs at once (one squeue, one sacct) every ``poll_interval``
seconds, through the status cache every clusterjob process shares.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from clusterjob.errors import ClusterjobError, JobFailed, JobTimeout, SlurmError, UsageError
from clusterjob.slurm.runner import LocalTransport, Runner, SlurmResult, SshTransport

if TYPE_CHECKING:
    from clusterjob.api.remote import HostProfile
    from clusterjob.jobs.registry import JobRecord, Registry
    from clusterjob.jobs.status import JobStatus, StatusCache
    from clusterjob.jobs.submit import Submitted, TestOnlyResult
    from clusterjob.jobs.wait import WaitResult
    from clusterjob.jobscript.render import RenderedJob
    from clusterjob.jobscript.request import ResolvedJob
    from clusterjob.site.model import Site
    from clusterjob.slurm.commands import SlurmClient

DEFAULT_POLL_INTERVAL = 10.0  # seconds between the poller's looks at Slurm (as `wait`)
CHECKPOINT_GRACE = 90  # seconds before the time limit a checkpointable function is warned
RESULT_GRACE = 30.0  # how long a COMPLETED function job's result file may lag (shared fs)
WORKER_NAME = "clusterjob_worker.py"

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

    @property
    def notes(self) -> tuple[str, ...]:
        return self.resolved.notes

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

    def __repr__(self) -> str:
        where = f"host={self.host!r}" if self.host else "local"
        return f"Cluster({where}, site={self._site_spec!r})"

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
                path = find_site(
                    self._site_spec,
                    environ=os.environ,
                    cluster_name=lambda: self.client().cluster_name(),
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
            token=token or new_token(),
        )
        if request.dependency and "last" in request.dependency:
            from clusterjob.jobs.submit import expand_dependency

            request = replace(
                request, dependency=expand_dependency(request.dependency, self.registry())
            )
        site = self.site
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
        return Prepared(resolved, render(site, resolved))

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
        """Send a prepared job to Slurm exactly once (the CLI's ``submit`` ends here)."""
        from clusterjob.jobs import submit as job_submit

        request = prepared.resolved.request
        if self.remote:
            workdir = self._remote_workdir()
            if mkdir:
                self._remote_mkdirs(workdir, (request.output, request.error))
            source: Path | None = self.workdir if self._sync else None
        else:
            job_submit.check_output_dirs(request.output, request.error, self.workdir, mkdir=mkdir)
            workdir, source = str(self.workdir), self.workdir
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
        from clusterjob.jobs.registry import data_dir

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
        jobdir = f"{self._function_root()}/{token}"
        try:
            payload = cloudpickle.dumps((worker.PROTOCOL, fn, calls))
        except Exception as exc:
            raise UsageError(f"cannot pickle {_name(fn)} and its arguments: {exc}") from None
        self.transport.write_bytes(f"{jobdir}/input.pkl", payload)
        self.transport.write_bytes(f"{jobdir}/{WORKER_NAME}", Path(worker.__file__).read_bytes())
        if callable(getattr(fn, "checkpoint", None)):
            options.setdefault("signal", f"B:USR1@{CHECKPOINT_GRACE}")
            options.setdefault("requeue", True)
        if array:
            limit = str(options.get("array") or "")
            if limit and not limit.startswith("%"):
                raise UsageError("map(): give at most array='%N' (how many tasks run at once)")
            options["array"] = f"0-{len(calls) - 1}{limit}"
        options.setdefault(
            "output", f"{jobdir}/slurm-%A_%a.out" if array else f"{jobdir}/slurm-%j.out"
        )
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
        """``clusterjob wait``: poll until the jobs end (or ``timeout``)."""
        from clusterjob.jobs.wait import wait

        return wait(
            list(jobs),
            timeout=timeout,
            interval=interval,
            client=self.client(),
            registry=self.registry(),
            cache=self.cache(),
        )

    def resubmit(
        self,
        job: str,
        *,
        changes: object = None,
        same_script: bool = False,
    ) -> Submitted:
        """``clusterjob resubmit``: a recorded job again, re-rendered with today's site (and
        ``changes``, a ``clusterjob.jobs.submit.Changes``) or ``same_script``."""
        from clusterjob.jobs.submit import Changes, resubmit

        if self.remote and not same_script:
            raise UsageError(
                "resubmit with --host replays the recorded script: add --same-script "
                "(or submit again, which syncs the code and renders the job anew)"
            )
        assert changes is None or isinstance(changes, Changes)
        return resubmit(
            job,
            site=None if same_script else self.site,
            changes=changes,
            same_script=same_script,
            client=self.client(),
            registry=self.registry(),
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
    COMPLETED. A job that ended otherwise raises ``JobFailed``.
    """

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
        self._completed_without_result: float | None = None
        self._ended_without_code: float | None = None
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
        self.cluster._poller.wake()
        done, _ = concurrent.futures.wait([self], timeout=timeout)
        if not done:
            raise JobTimeout(f"job {self.id} still {self._shown_state()} after {timeout:g}s")
        if self.last_status is None or self.cancelled():
            return self.status()  # cancelled here: Slurm's word on how it ended
        return self.last_status

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
        self._set(exception=self._no_result(row))

    def _set(self, *, result: Any = None, exception: BaseException | None = None) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if exception is not None:
                self.set_exception(exception)
            else:
                self.set_result(result)

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


def _failed(job_id: str, row: JobStatus) -> JobFailed:
    code = f" (exit {row.exit_code})" if row.exit_code not in (None, 0) else ""
    why = f": {row.explanation}" if row.explanation else ""
    return JobFailed(f"job {job_id} ended {row.state}{code}{why}", row.state, row.exit_code)


class _Poller:
    """One thread per cluster that settles its unfinished jobs: every ``poll_interval``, ONE
    status query for all of them (one squeue, one sacct, or none from the status cache)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        self.last_error: ClusterjobError | None = None

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
        while True:
            jobs = self.pending()
            if not jobs:
                with self._lock:
                    if not [j for j in self._jobs if not j.done()]:
                        self._thread = None
                        return
                continue
            try:
                self.refresh(jobs)
                self.last_error = None
            except ClusterjobError as exc:  # Slurm or ssh down for a while: try again later
                self.last_error = exc
            except Exception as exc:  # a bug must not leave the futures hanging forever
                for job in jobs:
                    job._set(exception=exc)
            self._wake.wait(self.cluster.poll_interval)
            self._wake.clear()

    def refresh(self, jobs: Sequence[Job]) -> None:
        """One status query for ``jobs`` (arrays asked for by their own id, with tasks)."""
        from clusterjob.slurm.syntax import split_array_id

        ids = sorted({split_array_id(j.id)[0] for j in jobs})
        rows = _status_rows(self.cluster, ids)
        self.refreshes += 1
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
