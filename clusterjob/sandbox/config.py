"""What the sandbox cluster looks like, and the config files that say so.

One table (``SANDBOX_NODES``) is the source of the site YAML, of ``slurm.conf``'s node lines
and of ``gres.conf``, so the three cannot disagree. The stand-in GPUs a node "physically"
has (what NVML will report) are listed separately from what the site's node map says, so a
node can be deliberately wrong: ``gpu3`` has its V100s at the first bus IDs while the map
puts A100s there. Pure functions only: nothing here touches the machine.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from clusterjob import envvars
from clusterjob.node.wrappers import HookWrappers
from clusterjob.sandbox import runtime
from clusterjob.site import admin
from clusterjob.site.model import NodeMap, QosLimits, Site

CLUSTER_NAME = "sandbox"
ACCOUNT = "sandbox"
DEFAULT_STATE_DIR = Path("/var/lib/clusterjob-sandbox")
HOSTS_MARKER = "# clusterjob-sandbox"

# The Slurm releases a sandbox can run, oldest first, and the Debian suite shipping each.
RELEASE_SUITES: dict[str, str] = {"22.05": "bookworm", "24.11": "trixie", "26.05": "sid"}
# Each release's sandbox takes its ports from its own part of the range (the host's 22.05
# keeps 26800-26999), so sandboxes of different releases can run side by side; in it, each
# sandbox a block of 20 (two or more for more than 10 nodes).
PORT_BASE = 26800
PORT_BLOCK = 20
PORTS_PER_RELEASE = 200


def named_state_dir(option: Path | None) -> tuple[Path | None, str]:
    """The state directory a command names, and how: ``--state-dir``, else
    ``CLUSTERJOB_SANDBOX_DIR``; (None, "the default") when neither does."""
    if option is not None:
        return option.absolute(), "--state-dir"
    env = os.environ.get(envvars.SANDBOX_DIR)
    if env:
        return Path(env).absolute(), envvars.SANDBOX_DIR
    return None, "the default"


def release_of(version_text: str) -> str | None:
    """``22.05`` from what ``sinfo -V`` / ``slurmd -V`` print (``slurm 22.05.8``)."""
    m = re.search(r"(\d+)\.(\d+)\.\d+", version_text)
    return f"{int(m.group(1)):02d}.{int(m.group(2)):02d}" if m else None


def port_range(release: str | None) -> range:
    """Where a sandbox of ``release`` looks for a free block of ports."""
    known = list(RELEASE_SUITES)
    offset = known.index(release) if release in known else 0
    start = PORT_BASE + offset * PORTS_PER_RELEASE
    return range(start, start + PORTS_PER_RELEASE, PORT_BLOCK)


def cgroup_conf(release: str | None) -> str | None:
    """cgroup.conf for ``release``: from 24.05 slurmd will not start without a cgroup file
    system unless told ``CgroupPlugin=disabled``, which 22.05 refuses; None: write none."""
    if release is None or tuple(map(int, release.split("."))) < (24, 5):
        return None
    head = "# Written by `clusterjob sandbox up`; regenerated on every start.\n"
    return head + "CgroupPlugin=disabled\n"


@dataclass(frozen=True)
class SandboxModel:
    """A GPU model of the sandbox site, with what the stand-in NVML calls it."""

    name: str
    aliases: tuple[str, ...]
    gres_type: str
    nvml_name: str
    memory_gb: int


MODELS: dict[str, SandboxModel] = {
    m.name: m
    for m in (
        SandboxModel(
            "A100", ("a100", "A100-80GB", "a100-sxm4-80gb"), "a100", "NVIDIA A100-SXM4-80GB", 80
        ),
        SandboxModel(
            "V100", ("v100", "V100-32GB", "tesla-v100"), "v100", "Tesla V100-SXM2-32GB", 32
        ),
        SandboxModel(
            "H100", ("h100", "H100-80GB", "h100-sxm5-80gb"), "h100", "NVIDIA H100 80GB HBM3", 80
        ),
        # MIG slices of the A100: each profile a model, its GRES type the profile (a type with
        # "a100" in it would be taken for the whole GPU too: Slurm matches types by substring).
        *(
            SandboxModel(f"A100-{p}", (p,), p, f"NVIDIA A100-SXM4-80GB MIG {p}", int(p[3:-2]))
            for p in ("3g.40gb", "2g.20gb", "1g.10gb")
        ),
    )
}


@dataclass(frozen=True)
class SandboxGpu:
    model: str  # key of MODELS
    bus_id: str  # sysfs form, 0000:07:00.0
    # MIG slices: in the node map, its `mig:` entries (profile@GPU instance); as NVML shows
    # them, the profiles of its MIG devices in order (the stand-in's GPU instances 1, 2, ...)
    mig: tuple[str, ...] = ()


@dataclass(frozen=True)
class SandboxNode:
    """A node: its partition, its GPUs as the site's node map says, and as NVML will show them."""

    name: str
    partition: str
    mapped: tuple[SandboxGpu, ...]  # node map order == Slurm GRES index order
    physical: tuple[SandboxGpu, ...]  # stand-in NVML order (PCI bus order)
    cpus: int = 16
    memory_mb: int = 64000


def _gpus(*pairs: tuple[str, str]) -> tuple[SandboxGpu, ...]:
    return tuple(SandboxGpu(model, f"0000:{bus}:00.0") for model, bus in pairs)


_MIXED = _gpus(("A100", "07"), ("A100", "0b"), ("V100", "48"), ("V100", "4c"))
# gpu3's V100s sit at the first bus IDs: NVML order differs from the node map (and gres.conf).
_MIXED_SWAPPED = _gpus(("V100", "07"), ("V100", "0b"), ("A100", "48"), ("A100", "4c"))
_H100X8 = _gpus(*(("H100", b) for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")))
# mig1: one A100 in MIG mode, a GRES index per slice (gres.conf MultipleFiles= records). Its
# GPU instances 2 and 3 are a 1g.10gb and a 2g.20gb slice, where the map (and so gres.conf)
# says 2g.20gb and 1g.10gb: the same profiles, so the node passes the Prolog, but a job that
# asks for the 2g.20gb slice gets a 1g.10gb one, which its preflight refuses.
_MIG_MAPPED = (
    SandboxGpu("A100", "0000:07:00.0", ("3g.40gb@1", "2g.20gb@2", "1g.10gb@3", "1g.10gb@4")),
)
_MIG_PHYSICAL = (SandboxGpu("A100", "0000:07:00.0", ("3g.40gb", "1g.10gb", "2g.20gb", "1g.10gb")),)

SANDBOX_NODES: tuple[SandboxNode, ...] = (
    SandboxNode("gpu1", "gpu", _MIXED, _MIXED),
    SandboxNode("gpu2", "gpu", _MIXED, _MIXED),
    SandboxNode("gpu3", "suspect", _MIXED, _MIXED_SWAPPED),
    SandboxNode("h1", "h100", _H100X8, _H100X8),
    SandboxNode("mig1", "mig", _MIG_MAPPED, _MIG_PHYSICAL),
)

# Partition -> (hostlist, default?). Ordinary jobs go to `gpu`; `suspect` only when asked.
PARTITIONS: dict[str, tuple[str, bool]] = {
    "gpu": ("gpu[1-2]", True),
    "suspect": ("gpu3", False),
    "h100": ("h1", False),
    "mig": ("mig1", False),
}


@dataclass(frozen=True)
class PartitionShape:
    name: str
    hostlist: str
    default: bool
    max_time: str = "2-00:00:00"
    exclusive: bool = False  # whole nodes, with all their GPUs (OverSubscribe=EXCLUSIVE)


@dataclass(frozen=True)
class ClusterShape:
    """What a sandbox cluster is: its nodes (GPUs as the node map says them and as NVML will
    show them), partitions, GRES types, node features, accounts and QoS. The sandbox's own
    (``DEFAULT_SHAPE``, from the tables above), or one made from a site file
    (``clusterjob.sandbox.shape``, `sandbox up --like SITE`)."""

    nodes: tuple[SandboxNode, ...]
    partitions: tuple[PartitionShape, ...]
    gres_types: tuple[str, ...]
    # model -> (NVML name, memory in bytes) for the stand-in; empty: the sandbox's own makers
    nvml: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    features: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # node -> features
    type_required: bool = True  # job_submit/lua refuses a GPU request without a type
    accounts: tuple[str, ...] = (ACCOUNT,)
    qos: tuple[QosLimits, ...] = ()
    # the partitions a job that names none may run in, where the site routes jobs (its
    # partitions of `submit_as: none`); empty: Slurm's default partition
    routed: tuple[str, ...] = ()
    like: str | None = None  # the site file it was made from
    cluster_name: str = CLUSTER_NAME  # Slurm's ClusterName: a site shape's is the site's


DEFAULT_SHAPE = ClusterShape(
    SANDBOX_NODES,
    tuple(PartitionShape(n, hosts, default) for n, (hosts, default) in PARTITIONS.items()),
    tuple(m.gres_type for m in MODELS.values()),
)
# A block of ports holds 10 slurmds; a sandbox of more nodes claims consecutive blocks.
# 30 slurmds run on two cores: idle, each is a few MB and no CPU.
MAX_NODES = 30


def blocks_for(nodes: int) -> int:
    """The consecutive blocks of ports a sandbox of ``nodes`` slurmds claims."""
    return -(-(10 + nodes) // PORT_BLOCK)


@dataclass(frozen=True)
class Ports:
    """TCP ports of one sandbox; a block nothing else on the machine uses."""

    slurmctld: int
    slurmdbd: int
    mariadb: int
    slurmd: dict[str, int]

    @classmethod
    def from_base(cls, base: int, nodes: tuple[SandboxNode, ...] = SANDBOX_NODES) -> Ports:
        return cls(base, base + 1, base + 2, {n.name: base + 10 + i for i, n in enumerate(nodes)})

    def all(self) -> list[int]:
        return [self.slurmctld, self.slurmdbd, self.mariadb, *self.slurmd.values()]


@dataclass(frozen=True)
class Layout:
    """Where every file of one sandbox lives: all of it under one state directory."""

    state_dir: Path

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def slurmdbd_conf(self) -> Path:  # slurmdbd looks next to SLURM_CONF
        return self.state_dir / "slurmdbd.conf"

    @property
    def gres_conf(self) -> Path:
        return self.state_dir / "gres.conf"

    @property
    def cgroup_conf(self) -> Path:  # read next to slurm.conf
        return self.state_dir / "cgroup.conf"

    @property
    def job_submit_lua(self) -> Path:  # job_submit/lua reads it next to slurm.conf
        return self.state_dir / "job_submit.lua"

    @property
    def site_yaml(self) -> Path:
        return self.state_dir / "site.yaml"

    @property
    def munge_dir(self) -> Path:
        return self.state_dir / "munge"

    @property
    def munge_socket(self) -> Path:
        return self.munge_dir / "munge.socket"

    @property
    def mariadb_dir(self) -> Path:
        return self.state_dir / "mariadb"

    @property
    def mariadb_socket(self) -> Path:
        return self.state_dir / "mariadb-run" / "mysqld.sock"

    @property
    def lib_dir(self) -> Path:  # the stand-in libnvidia-ml.so.1
        return self.state_dir / "lib"

    @property
    def nvml_dir(self) -> Path:  # one stand-in scenario per node
        return self.state_dir / "nvml"

    @property
    def dev_dir(self) -> Path:  # one folder of device nodes per Slurm node
        return self.state_dir / "dev"

    @property
    def hooks_dir(self) -> Path:
        return self.state_dir / "hooks"

    @property
    def bin_dir(self) -> Path:
        return self.state_dir / "bin"

    @property
    def hook_python_dir(self) -> Path:  # an interpreter every user can run, when needed
        return self.state_dir / "python"

    @property
    def runtime_dir(self) -> Path:  # what that interpreter imports, when it cannot be reached
        return self.state_dir / "runtime"

    @property
    def cache_dir(self) -> Path:  # the Prolog's parsed-site cache
        return self.state_dir / "cache"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def pid_dir(self) -> Path:  # our own pid files, one per daemon we started
        return self.state_dir / "pids"

    @property
    def prolog_log(self) -> Path:
        return self.log_dir / "prolog.jsonl"

    def scenario(self, node: str) -> Path:
        return self.nvml_dir / f"{node}.scenario"

    def device(self, node: str, index: int) -> Path:
        return self.dev_dir / node / f"nvidia{index}"

    def devices(self, node: SandboxNode) -> list[Path]:
        """Every device file gres.conf names for ``node``: /dev/nvidiaN per GPU and, per MIG
        slice, its GPU and compute instance's nvidia-caps files."""
        out = [self.device(node.name, i) for i in range(len(node.mapped))]
        for i, gpu in enumerate(node.mapped):
            for text in gpu.mig:
                if "@" not in text:  # no GPU instance in the map: gres.conf autodetects it
                    continue
                minors = admin.mig_cap_minors(i, int(text.partition("@")[2]))
                out += [self.dev_dir / node.name / "nvidia-caps" / f"nvidia-cap{n}" for n in minors]
        # an AMD GPU's render node (a site shape's, `up --like`): its index from 128
        out += [self.dev_dir / node.name / f"renderD{128 + i}" for i in range(len(node.mapped))]
        return out


def gres_from_site(
    site: Site, layout: Layout, nodes: tuple[SandboxNode, ...] = SANDBOX_NODES
) -> tuple[str, dict[str, str]]:
    """gres.conf and each node's ``Gres=`` value, from the site's node map (through the same
    admin helpers a real site uses) for the sandbox's ``nodes``; one device folder per node
    (``dev/<node>/nvidiaN``)."""
    lines = ["# Written by `clusterjob sandbox up` from site.yaml; regenerated on every start."]
    names = {n.name for n in nodes}
    for node, gpus in site.node_map.nodes.items():
        if node not in names:
            continue
        # MIG slices the map gives without GPU instances are the stand-in's 1, 2, ...
        # (Slurm's NVML autodetection cannot see the stand-in)
        gpus = tuple(
            g.replace(mig_gi=tuple(range(1, len(g.mig) + 1))) if g.mig and not g.mig_gi else g
            for g in gpus
        )
        one_node = replace(site, node_map=NodeMap({node: gpus}))
        where = layout.dev_dir / node
        lines += admin.gres_conf_lines(one_node, f"{where}/nvidia", f"{where}/renderD")
    return "\n".join(lines) + "\n", admin.node_gres_strings(site)


def slurm_conf(
    layout: Layout,
    ports: Ports,
    node_gres: Mapping[str, str],
    *,
    hooks: bool = True,
    shape: ClusterShape = DEFAULT_SHAPE,
) -> str:
    """slurm.conf: accounting through our slurmdbd, munge on our socket, one line per node."""
    s = layout.state_dir
    lines = [
        "# Written by `clusterjob sandbox up`; regenerated on every start.",
        f"ClusterName={shape.cluster_name}",
        "SlurmctldHost=localhost",
        f"SlurmctldPort={ports.slurmctld}",
        f"AuthInfo=socket={layout.munge_socket}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={s}/slurmctld",
        f"SlurmdSpoolDir={s}/slurmd/%n",
        f"SlurmctldPidFile={s}/run/slurmctld.pid",
        f"SlurmdPidFile={s}/run/slurmd-%n.pid",
        # No cgroups: processes are tracked through /proc, tasks are not confined.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        # Without a default a job gets all of a node's memory, and nodes could not be shared.
        "DefMemPerCPU=1024",
        "SlurmdParameters=config_overrides",
        f"GresTypes=gpu,{COUNT_ONLY_GRES.split(':', 1)[0]}",
        # Site rules as real sites write them (job_submit/lua): a GPU request must name a
        # type; a job that names no partition is routed to the site's routed ones.
        *(["JobSubmitPlugins=lua"] if shape.type_required or shape.routed else []),
        "MpiDefault=none",
        "ReturnToService=2",
        "MinJobAge=3600",
        # Room for a busy cluster's job table beside a day of tests: the benchmarks fill the
        # controller to 7,500 jobs (squeue's cost grows with it), and an ended or cancelled
        # job stays for MinJobAge; at Slurm's default of 10,000 a second run was refused.
        "MaxJobCount=50000",
        "KillWait=5",
        "InactiveLimit=0",
        "SlurmdTimeout=120",
        # A Prolog still running after MessageTimeout - 2 s has slurmd write "Prolog hung on
        # node" into the job's output (it goes on waiting); on a loaded 2-core machine the
        # Python Prolog took longer than the default 10 s allows, and a job's output read
        # wrong. 30 s: longer than the Prolog's own deadline (the site's deadline_seconds,
        # 20 s here), so a Prolog that runs to its deadline is never reported hung.
        "MessageTimeout=30",
        "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={ports.slurmdbd}",
        # For the slurmdbd storage type this names the munge socket clients authenticate with.
        f"AccountingStoragePass={layout.munge_socket}",
        "AccountingStorageTRES=gres/gpu,"
        + ",".join(f"gres/gpu:{t}" for t in dict.fromkeys(shape.gres_types)),
        "PrologFlags=Alloc",
    ]
    if hooks:
        wrappers = hook_wrappers(layout)
        lines += [f"Prolog={wrappers.prolog}", f"TaskProlog={wrappers.task_prolog}"]
        lines += [f"Epilog={wrappers.epilog}"]
    for node in shape.nodes:
        gres = ",".join(g for g in (node_gres.get(node.name, ""), COUNT_ONLY_GRES) if g)
        features = shape.features.get(node.name, ())
        lines.append(
            f"NodeName={node.name} NodeAddr=127.0.0.1 NodeHostname=localhost"
            f" Port={ports.slurmd[node.name]} CPUs={node.cpus} RealMemory={node.memory_mb}"
            + (f" Features={','.join(features)}" if features else "")
            + f" Gres={gres} State=UNKNOWN"
        )
    for part in shape.partitions:
        lines.append(
            f"PartitionName={part.name} Nodes={part.hostlist} "
            f"Default={'YES' if part.default else 'NO'} MaxTime={part.max_time}"
            + (" OverSubscribe=EXCLUSIVE" if part.exclusive else "")
            + " State=UP"
        )
    return "\n".join(lines) + "\n"


# A count-only GRES beside the GPUs on every node, as sites list scratch space or licences
# (Ohio Supercomputer Center's GPU nodes print `pfsdir:scratch:no_consume:1`): GPU counts in
# `avail` and `site diff` must not be thrown by it.
COUNT_ONLY_GRES = "pfsdir:scratch:no_consume:1"


def job_submit_lua(shape: ClusterShape) -> str:
    """The cluster's job_submit.lua: refuses a GPU request without a type where the shape
    requires one, with the words such sites' plugins print (sbatch then says "Batch job
    submission failed: Unspecified error" after them); gives a job that names no partition
    the shape's routed ones, as a site that routes jobs by their request does."""
    routed = ",".join(shape.routed)
    return _JOB_SUBMIT_LUA.replace(
        "@TYPE_REQUIRED@", "true" if shape.type_required else "false"
    ).replace("@ROUTED@", f'"{routed}"' if routed else "nil")


_JOB_SUBMIT_LUA = """\
-- Written by `clusterjob sandbox up`; regenerated on every start.
local TYPE_REQUIRED = @TYPE_REQUIRED@
local ROUTED = @ROUTED@

local function untyped_gpu(tres)
   if tres == nil then
      return false
   end
   for item in string.gmatch(tres, "[^,]+") do
      local bare = string.gsub(item, "^gres[:/]", "")
      if bare == "gpu" or string.match(bare, "^gpu:%d+$") then
         return true
      end
   end
   return false
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   -- by name: a table of the values would stop ipairs at the first one that is nil
   for _, key in ipairs({"tres_per_node", "tres_per_job", "tres_per_task", "tres_per_socket"}) do
      if TYPE_REQUIRED and untyped_gpu(job_desc[key]) then
         slurm.log_user("You must always specify a type when requesting gpu GRES")
         return slurm.ERROR
      end
   end
   if ROUTED ~= nil and job_desc.partition == nil then
      job_desc.partition = ROUTED
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
"""


def slurmdbd_conf(layout: Layout, ports: Ports, db_password: str) -> str:
    """slurmdbd.conf (mode 600): our MariaDB over TCP on 127.0.0.1, a user of its own."""
    return "\n".join(
        [
            "# Written by `clusterjob sandbox up`; regenerated on every start.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={layout.munge_socket}",
            "DbdHost=localhost",
            f"DbdPort={ports.slurmdbd}",
            "SlurmUser=root",
            f"PidFile={layout.state_dir}/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={ports.mariadb}",
            "StorageUser=slurm",
            f"StoragePass={db_password}",
            "StorageLoc=slurm_acct_db",
            "",
        ]
    )


def _yaml_str(text: str) -> str:
    """A double-quoted YAML scalar (JSON string syntax is valid YAML)."""
    import json

    return json.dumps(text)


def site_yaml(layout: Layout) -> str:
    """The sandbox's site config, in the schema every site uses."""
    out = [
        "# The site of the local sandbox cluster; written by `clusterjob sandbox up`.",
        f"site: {CLUSTER_NAME}",
        f"cluster_name: {CLUSTER_NAME}",
        f"node_command: {_yaml_str(str(layout.bin_dir / 'clusterjob'))}",
        "gpu_request:",
        "  syntax: gres",
        "  type_required: true",
        "models:",
    ]
    for m in MODELS.values():
        out += [
            f"  {m.name}:",
            f"    aliases: [{', '.join(_yaml_str(a) for a in m.aliases)}]",
            f"    gres_type: {m.gres_type}",
            f"    nvml_names: [{_yaml_str(m.nvml_name)}]",
            f"    memory_gb: {m.memory_gb}",
        ]
    out.append("partitions:")
    for name, (hostlist, default) in PARTITIONS.items():
        out += [
            f"  {name}:",
            f"    nodes: {_yaml_str(hostlist)}",
            '    time_limit: "1-00:00:00"',
            f"    default: {'true' if default else 'false'}",
            f"    defaults: {{account: {ACCOUNT}, cpus_per_gpu: 1, mem_per_gpu: 1G}}",
        ]
    out.append("node_map:")
    for node in SANDBOX_NODES:
        out += [f"  - nodes: {node.name}", "    gpus:"]
        out += [
            f'      - {{model: {g.model}, bus_id: "{g.bus_id}"'
            + (f", mig: [{', '.join(_yaml_str(s) for s in g.mig)}]" if g.mig else "")
            + "}"
            for g in node.mapped
        ]
    out += [
        "prolog:",
        "  on_error: drain",
        "  deadline_seconds: 20",
        f"  log: {_yaml_str(str(layout.prolog_log))}",
        "",
    ]
    return "\n".join(out)


def standin_env(layout: Layout) -> tuple[tuple[str, str], ...]:
    """(NAME, VALUE, expanded by the shell): NVML is the stand-in, and Slurm's clients find
    this cluster. The hooks get these as `site install-hooks --env NAME=VALUE` gives them."""
    return (
        ("LD_LIBRARY_PATH", f"{layout.lib_dir}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"),
        ("FAKE_NVML_SCENARIO", f"{layout.nvml_dir}/${{SLURMD_NODENAME}}.scenario"),
        ("SLURM_CONF", str(layout.slurm_conf)),
    )


# The clusterjob that brought the sandbox up, whether installed or a source checkout.
_PACKAGE_ROOT = Path(__file__).resolve().parent.parent.parent


def hook_python(layout: Layout) -> Path:
    """The interpreter of the hooks and the node_command, which run as the job's user too:
    this one when every user can run it and reach the clusterjob it imports, else the
    sandbox's own (``make_hook_python``), as when this Python, or the checkout, lives in
    root's home and other users' jobs would fail."""
    here = Path(sys.executable)
    own = layout.hook_python_dir / "bin" / "python"
    return here if runtime.reachable_here() or not own.exists() else own


def package_root(layout: Layout) -> Path:
    """The tree the node_command puts first on ``sys.path``: this clusterjob's, or the copy
    the sandbox's own interpreter imports when other users cannot reach this one."""
    if runtime.reachable_here():
        return _PACKAGE_ROOT
    return runtime.CopiedRuntime(layout.runtime_dir).src


def hook_wrappers(layout: Layout, *, installed: bool = True) -> HookWrappers:
    """The Prolog and TaskProlog exactly as `clusterjob site install-hooks` writes them
    (isolated interpreter, fixed cwd), with the stand-in's environment, which the TaskProlog
    passes on to the job's tasks. Not ``installed`` (this clusterjob is a source tree the
    interpreter cannot import on its own): the wrappers name the tree."""
    return HookWrappers(
        prefix=layout.hooks_dir,
        python=hook_python(layout),
        site=layout.site_yaml,
        cache_dir=layout.cache_dir,
        environment=standin_env(layout),
        package_root=None if installed else _PACKAGE_ROOT,
    )


def prolog_script(layout: Layout) -> str:
    """Slurm's Prolog= takes a path without arguments: this wrapper supplies them."""
    return hook_wrappers(layout).prolog_text()


def task_prolog_script(layout: Layout) -> str:
    """TaskProlog: its `export` lines reach the job's tasks, so they see the stand-in GPUs too."""
    return hook_wrappers(layout).task_prolog_text()


def node_command_script(layout: Layout) -> str:
    """What job scripts call as `node_command`: this clusterjob, on the stand-in GPUs.

    Isolated (``-I``) with this clusterjob put first on ``sys.path`` by absolute path: a job
    runs it from whatever directory it was submitted in, and a ``clusterjob/`` someone left
    there must not be what runs."""
    boot = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        "import clusterjob.__main__ as m; sys.exit(m.main())"
    )
    return "\n".join(
        [
            "#!/bin/sh",
            "# Written by `clusterjob sandbox up`: the node_command of sandbox job scripts.",
            *(f'export {name}="{value}"' for name, value in standin_env(layout)),
            f"exec {shlex.quote(str(hook_python(layout)))} -I -c {shlex.quote(boot)} "
            f'{shlex.quote(str(package_root(layout)))} "$@"',
            "",
        ]
    )
