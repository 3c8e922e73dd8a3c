"""Every environment variable clusterjob reads or sets, in one table.

The code names a variable through its constant here (``envvars.SITE``), and the reference
page (docs/reference/environment.md) is generated from ``ENV_VARS``; a test fails when the
package or its templates mention a ``CLUSTERJOB_*`` name this table lacks. Stdlib only:
the Slurm hooks import it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ENV_VARS", "EnvVar"]


@dataclass(frozen=True)
class EnvVar:
    """One variable: who reads (or sets) it, its default, and what it changes."""

    name: str
    read_by: str  # the commands (or the job) it matters to
    default: str  # what happens when it is not set
    meaning: str  # one or two sentences, Markdown
    sets_it: str = ""  # when clusterjob itself sets it: who and where

    def __str__(self) -> str:
        return self.name


SITE = "CLUSTERJOB_SITE"
SLURM_DEADLINE = "CLUSTERJOB_SLURM_DEADLINE"
DATA_DIR = "CLUSTERJOB_DATA_DIR"
STATUS_CACHE_SECONDS = "CLUSTERJOB_STATUS_CACHE_SECONDS"
DEBUG = "CLUSTERJOB_DEBUG"
LOCK_DIR = "CLUSTERJOB_LOCK_DIR"
SANDBOX_DIR = "CLUSTERJOB_SANDBOX_DIR"
SANDBOX_SLURM = "CLUSTERJOB_SANDBOX_SLURM"
SANDBOX_ROOTS = "CLUSTERJOB_SANDBOX_ROOTS"
GE_SANDBOX_JOBS = "CLUSTERJOB_GE_SANDBOX_JOBS"
GE_SOURCE_ADDRESS = "CLUSTERJOB_GE_SOURCE_ADDRESS"
HOST = "CLUSTERJOB_HOST"
RUNTIME_DIR = "CLUSTERJOB_RUNTIME_DIR"
SSH_CONFIG = "CLUSTERJOB_SSH_CONFIG"
EXPECT_MODEL = "CLUSTERJOB_EXPECT_MODEL"
EXPECT_COUNT = "CLUSTERJOB_EXPECT_COUNT"
TOKEN = "CLUSTERJOB_TOKEN"
MAX_REQUEUES = "CLUSTERJOB_MAX_REQUEUES"
SNAPSHOT = "CLUSTERJOB_SNAPSHOT"
ARRAY_INDEX = "CLUSTERJOB_ARRAY_INDEX"
GPU_BUS_IDS = "CLUSTERJOB_GPU_BUS_IDS"
USAGE_INTERVAL = "CLUSTERJOB_USAGE_INTERVAL"
SERVER = "CLUSTERJOB_SERVER"
NVML_SCENARIO = "FAKE_NVML_SCENARIO"

ENV_VARS: tuple[EnvVar, ...] = (
    EnvVar(
        SITE,
        "every command that needs a site config",
        "the search goes on: `~/.config/clusterjob/site.yaml`, `/etc/clusterjob/site.yaml`, "
        "then the known site whose `cluster_name` is Slurm's `ClusterName`",
        "The site config, as a PATH or a NAME (`NAME.yaml` in `~/.config/clusterjob/sites/`, "
        "`/etc/clusterjob/sites/`, then the example sites shipped with clusterjob). `--site` "
        "wins over it; a value that names nothing is an error. The root Prolog "
        "never reads it (its config comes only from its command line or `/etc`).",
        "every job script (the site it was submitted with); `clusterjob sandbox env`",
    ),
    EnvVar(
        SLURM_DEADLINE,
        "every command that calls Slurm",
        "no overall bound (each Slurm call still has its own timeout)",
        "Seconds that bound everything one command does with Slurm, retries included; past "
        "it the command exits 4 with one line.",
    ),
    EnvVar(
        DATA_DIR,
        "`submit`, `status`, `logs`, `wait`, `show`, `resubmit`, `cancel`",
        "`$XDG_DATA_HOME/clusterjob`, else `~/.local/share/clusterjob`",
        "Where the job registry (SQLite), the rendered job scripts and the status cache live.",
    ),
    EnvVar(
        STATUS_CACHE_SECONDS,
        "`status`, `wait`, `logs` (`submit` and `cancel` clear it)",
        "`10`",
        "How long (seconds) a squeue/sacct answer is shared by all clusterjob commands of "
        "the user; `0` turns the cache off. Not a number: one line, exit 2.",
    ),
    EnvVar(
        DEBUG,
        "every command",
        "off",
        "`1` is the same as `--debug`: tracebacks and the debug log on stderr.",
    ),
    EnvVar(
        LOCK_DIR,
        "`run` (workstation mode)",
        "`/var/lock/clusterjob` when it exists (or `/var/lock` is a shared sticky directory), "
        "else `/tmp/clusterjob-gpu-locks`",
        "The directory of the GPU claim files that `clusterjob run` holds for a command's "
        "lifetime; every user of the machine must use the same one.",
    ),
    EnvVar(
        SANDBOX_DIR,
        "`sandbox up`, `down`, `status`, `env`",
        "`/var/lib/clusterjob-sandbox`",
        "The local cluster's state directory (slurm.conf, spool, logs, database, the "
        "stand-in GPUs' scenarios); `--state-dir` wins over it.",
    ),
    EnvVar(
        SANDBOX_SLURM,
        "`sandbox up`, `down`, `status`, `env`, `exec`",
        "the Slurm the host ships",
        "The Slurm release of the local cluster (`22.05`, `24.11`, `26.05`); one the host "
        "does not ship runs in a Debian root of its own. `--slurm` wins over it.",
    ),
    EnvVar(
        SANDBOX_ROOTS,
        "`sandbox` with a `--slurm` release the host does not ship",
        "`/var/cache/clusterjob-sandbox`",
        "Where the Debian roots of other Slurm releases are built and kept.",
    ),
    EnvVar(
        GE_SANDBOX_JOBS,
        "you (the shell `sandbox env --scheduler gridengine` sets up)",
        "-",
        "The local Grid Engine cluster's shared `jobs/` folder: job scripts and outputs there "
        "are seen at the same path by its `qsub` and by its jobs.",
        "`clusterjob sandbox env --scheduler gridengine`",
    ),
    EnvVar(
        GE_SOURCE_ADDRESS,
        "the local Grid Engine cluster's preload library (`gridengine_source_address.c`)",
        "-: connections come from wherever the system binds them",
        "The loopback address an execution host's connections come from, so the qmaster "
        "knows it by its own name; its jobs inherit it.",
        "`clusterjob sandbox up --scheduler gridengine`, for each execution daemon",
    ),
    EnvVar(
        HOST,
        "the job commands (`submit`, `status`, `logs`, ...) and the Python API",
        "this machine's Slurm",
        "The cluster behind this login node, over ssh: `[USER@]HOST[:PORT]` or the name of a "
        "profile in `~/.config/clusterjob/hosts.yaml`. `--host` wins over it.",
    ),
    EnvVar(
        RUNTIME_DIR,
        "commands run against a remote cluster over SSH; `submit` and `status`",
        "`$XDG_RUNTIME_DIR/clusterjob`, else `/tmp/clusterjob-UID`",
        "Where the shared SSH connection and the command server keep their sockets; it must "
        "belong to you with mode 0700.",
    ),
    EnvVar(
        SERVER,
        "`submit` and `status`",
        "`1`",
        "`1`: hand `submit` and `status` to a command server of yours that has clusterjob "
        "loaded (started in the background by the first of them, it ends after 2 minutes "
        "without a command), so that a shell loop of submissions does not load clusterjob "
        "each time; `0`: run every command in its own process, and start no server. See "
        "[the command server](../getting-started/researcher.md#the-command-server).",
    ),
    EnvVar(
        SSH_CONFIG,
        "commands run against a remote cluster over SSH",
        "`~/.ssh/config`",
        "An ssh_config file for the connection to the login node (`ssh -F FILE`).",
    ),
    EnvVar(
        EXPECT_MODEL,
        "`preflight` (in the job)",
        "no model is checked",
        "The GPU model the job asked for; the preflight fails the job when its GPUs are "
        "another model. Same as `preflight --expect-model`.",
        "the job script, from `submit --model`; `shell`",
    ),
    EnvVar(
        EXPECT_COUNT,
        "`preflight` (in the job)",
        "no count is checked",
        "How many GPUs the job asked for on each node. Same as `preflight --expect-count`.",
        "the job script, from `submit --gpus`; `shell`",
    ),
    EnvVar(
        TOKEN,
        "the job (for your own use)",
        "-",
        "The unique token of the submission, also in the job's `--comment`; it is how a "
        "`sbatch` whose reply was lost is found again instead of submitting twice.",
        "the job script",
    ),
    EnvVar(
        ARRAY_INDEX,
        "the job (for your own use)",
        "-",
        "On a Grid Engine site, which numbers array tasks from 1: this task's index of "
        "`--array` (and of a sweep), counted from 0 as on Slurm (`$SGE_TASK_ID - 1`).",
        "the job script of an array job on a Grid Engine site",
    ),
    EnvVar(
        MAX_REQUEUES,
        "the job, and a function job's worker",
        "-",
        "How many times the job may be requeued (preemption, node failure, `scontrol "
        "requeue`); an attempt started past it stops at once with exit 79 and says so.",
        "the job script, from `submit --max-requeues` (else the site's "
        "`defaults.max_requeues`, else 3)",
    ),
    EnvVar(
        SNAPSHOT,
        "the job, and a function job's worker",
        "-",
        "The copy of the job's code taken at submit (`--snapshot`): the program starts from "
        "it and it comes first on `PYTHONPATH` (a function job's `sys.path`).",
        "the job script, from `submit --snapshot`",
    ),
    EnvVar(
        USAGE_INTERVAL,
        "the job's GPU usage sampler (`clusterjob sample-usage`)",
        "30",
        "Seconds between two samples of the job's GPUs' utilisation, memory and power, which "
        "`status` and `show` report; `0` turns the sampler off. Set it at submit (the job "
        "inherits it) or in the site's `job.setup`.",
    ),
    EnvVar(
        GPU_BUS_IDS,
        "the command started by `clusterjob run`",
        "-",
        "The PCI bus IDs of the GPUs claimed for the command, comma-separated, in the order "
        "of `CUDA_VISIBLE_DEVICES`.",
        "`clusterjob run`",
    ),
    EnvVar(
        NVML_SCENARIO,
        "the stand-in `libnvidia-ml.so.1` of the sandbox and the tests",
        "the stand-in behaves as a node without the NVIDIA driver",
        "The scenario file describing the stand-in GPUs (names, bus IDs, faults, hangs); "
        "`%n` in the value is replaced by `$SLURMD_NODENAME`. A real NVML ignores it.",
        "the sandbox's hooks and slurmd environment",
    ),
)
