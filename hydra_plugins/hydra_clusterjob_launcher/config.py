"""``hydra/launcher=clusterjob``: the launcher's config, registered in Hydra's ConfigStore.

The job fields are the options of ``clusterjob submit`` (the keywords of
``clusterjob.Cluster.options``), with the same names and meanings; None (or empty) leaves
the site's default. ``tests/test_hydra_launcher.py`` fails when ``clusterjob submit`` gains
an option this config lacks, and checks that each field reaches the rendered job.

Left out, each for a reason: ``array`` (the launcher makes the array: one task per sweep
point; ``array_parallelism`` is its ``%N``), ``sweep`` and ``params`` (the points are
Hydra's sweeper's), ``retry_bad_node`` (one job's, not an array's) and ``avoid`` (the
user's avoid list of bad nodes always applies, as at ``clusterjob submit`` without
``--no-avoid``).
"""

# No `from __future__ import annotations` here: Hydra's plugin scan runs this module before
# it is in sys.modules, where a dataclass with string annotations cannot be made.
from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore

# The submit options this config does not carry (see the module's docstring).
NOT_LAUNCHER_OPTIONS = ("array", "sweep", "params", "retry_bad_node", "avoid")


@dataclass
class ClusterjobLauncherConf:
    _target_: str = "hydra_plugins.hydra_clusterjob_launcher.launcher.ClusterjobLauncher"

    # --- the cluster: clusterjob.Cluster(site, host=..., ...) ---
    site: str | None = None  # a site name or YAML file (default: clusterjob's discovery)
    host: str | None = None  # [USER@]HOST[:PORT] or a hosts.yaml profile ($CLUSTERJOB_HOST)
    remote_dir: str | None = None  # with host: where the code is synced to and jobs run
    sync: bool | None = None  # with host: rsync the working directory first (default: yes)
    poll_interval: float = 10.0  # seconds between looks at Slurm while waiting

    # --- the launcher ---
    wait: bool = False  # block until every task ends, and return their values
    timeout: float | None = None  # with wait: give up (JobTimeout) after this many seconds
    array_parallelism: int | None = None  # at most this many tasks at once (--array=...%N)

    # --- the job: the options of `clusterjob submit` ---
    gpus: int | None = None
    model: str | None = None
    nodes: int | None = None
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    cpus_per_gpu: int | None = None
    mem_per_gpu: str | None = None
    job_name: str | None = None  # default: Hydra's job name (the app's)
    dependency: str | None = None
    output: str | None = None  # default: ${hydra.sweep.dir}/.clusterjob/%A_%a.out
    error: str | None = None
    signal: str | None = None
    requeue: bool | None = None
    exclude: str | None = None
    nodelist: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    constraint: str | None = None
    sbatch_args: list[str] = field(default_factory=list)
    tasks_per_node: int | None = None
    launcher: str | None = None
    launcher_args: list[str] = field(default_factory=list)
    setup: list[str] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)
    env: list[str] = field(default_factory=list)  # KEY=VALUE, as --env
    gres: list[str] = field(default_factory=list)
    project: str | None = None
    container_image: str | None = None
    container_mounts: str | None = None
    apptainer: str | None = None
    python: str | None = None
    venv: str | None = None
    conda: str | None = None
    max_requeues: int | None = None
    snapshot: bool | None = None  # run from a copy of the code taken at submission


# The fields that are not job options: the cluster's and the launcher's own.
LAUNCHER_FIELDS = (
    "site", "host", "remote_dir", "sync", "poll_interval", "wait", "timeout",
    "array_parallelism",
)  # fmt: skip

ConfigStore.instance().store(
    group="hydra/launcher",
    name="clusterjob",
    node=ClusterjobLauncherConf,
    provider="clusterjob",
)
