"""The site config's one schema definition: every section, every key, its type and meaning.

The loader (``clusterjob.site.loader``) takes its valid-key tables from here (an unknown key
names the valid ones), ``json_schema()`` turns the same definition into a JSON Schema for
editors (``clusterjob site schema``; ``# yaml-language-server: $schema=...``), and
``reference_markdown()`` into the key reference page. Value checks that a JSON Schema cannot
express (a hostlist that expands, bus IDs in PCI order, cross-references between sections)
stay in the loader; the key set, the types, the choices and the defaults are defined once.

Standard library only: the Prolog's slow path (a cache miss) imports the loader, hence this.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# Value kinds. Each maps to a JSON Schema fragment in ``_value_schema``.
STRING = "string"
NULLABLE_STRING = "string or null"
INTEGER = "integer"
NUMBER = "number"
BOOLEAN = "boolean"
CHOICE = "choice"
STRING_LIST = "list of strings"
SECTION = "mapping"  # a fixed set of keys: ``section``
NAMED = "mapping of names"  # free names, each value a ``section``
LIST = "list"  # each item a ``section``
NAMED_CHOICE = "mapping of names to choices"  # free names, each value one of ``choices``

# JSON Schema patterns (ECMA 262) of values the loader checks with the same rules.
TIME_PATTERN = (
    r"^([0-9]+|[0-9]+:[0-9]+|[0-9]+:[0-9]+:[0-9]+|[0-9]+-[0-9]+|[0-9]+-[0-9]+:[0-9]+"
    r"|[0-9]+-[0-9]+:[0-9]+:[0-9]+|[Uu][Nn][Ll][Ii][Mm][Ii][Tt][Ee][Dd]|[Ii][Nn][Ff][Ii][Nn][Ii][Tt][Ee])$"
)
MEMORY_PATTERN = r"^[0-9]+[KMGT]?$"
GRES_TYPE_PATTERN = r"^[A-Za-z0-9_.-]+$"
BUS_ID_PATTERN = r"^\s*([0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]\s*$"
UUID_PATTERN = r"^(GPU|MIG)-[0-9a-fA-F-]+$"
MIG_PROFILE_PATTERN = r"^[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)*$"
# A slot's MIG slice: its profile, and after "@" its GPU instance id (0-14) where known.
MIG_SLICE_PATTERN = r"^[0-9]+g\.[0-9]+gb(\+[a-z0-9]+)*(@([0-9]|1[0-4]))?$"
CUDA_VERSION_PATTERN = r"^[0-9]+\.[0-9]$"
DRIVER_VERSION_PATTERN = r"^[0-9]+(\.[0-9]+){0,2}$"
# A model's node feature expression: feature names (Sherlock's GPU_SKU:V100_SXM2 has a colon)
# joined by Slurm's & and |, grouped with ( ) or [ ].
CONSTRAINT_PATTERN = r"^[A-Za-z0-9_.:&|()\[\]-]+$"
NON_EMPTY = r"\S"


@dataclass(frozen=True)
class Key:
    """One key of a section: its name, kind, whether it is required, and what it means."""

    name: str
    kind: str
    doc: str
    required: bool = False
    default: str | None = None  # the documented default, as a reader should see it
    choices: tuple[str, ...] | Callable[[], tuple[str, ...]] = ()
    section: Section | None = None  # SECTION, NAMED and LIST values
    minimum: int | None = None
    maximum: int | None = None
    pattern: str | None = None  # for STRING and STRING_LIST items
    example: str | None = None  # a value as written in YAML
    required_unless: tuple[str, str] | None = None  # (key, value): required unless key: value

    def choice_values(self) -> tuple[str, ...]:
        return self.choices() if callable(self.choices) else self.choices


@dataclass(frozen=True)
class Section:
    """A mapping with a fixed key set: where it appears, what it is for, and its keys."""

    id: str  # the JSON Schema definition name, e.g. "partition"
    path: str  # where it appears, e.g. "partitions.NAME"
    doc: str
    keys: tuple[Key, ...]
    also_at: tuple[str, ...] = ()  # other places the same section appears

    def key_table(self) -> dict[str, bool]:
        """Key name -> required: what the loader's ``Validator.mapping`` checks against."""
        return {k.name: k.required for k in self.keys}

    def key(self, name: str) -> Key:
        for k in self.keys:
            if k.name == name:
                return k
        raise KeyError(name)


def _syntax_names() -> tuple[str, ...]:
    from clusterjob.site.gpu_syntax import syntax_names  # the registry imports every syntax

    return syntax_names()


def _check_ids() -> tuple[str, ...]:
    from clusterjob.site.nodemodel import NODE_CHECK_IDS

    return tuple(sorted(NODE_CHECK_IDS))


def _severities() -> tuple[str, ...]:
    from clusterjob.site.nodemodel import CHECK_SEVERITIES

    return CHECK_SEVERITIES


def _model_constants(name: str) -> Callable[[], tuple[str, ...]]:
    def values() -> tuple[str, ...]:
        from clusterjob.site import model

        found: tuple[str, ...] = getattr(model, name)
        return found

    return values


def _on_error() -> tuple[str, ...]:
    from clusterjob.site.nodemodel import OnError

    return tuple(e.value for e in OnError)


# -- the sections ------------------------------------------------------------------------------

GPU_REQUEST = Section(
    "gpu_request",
    "gpu_request",
    "How this site wants GPUs asked for in sbatch.",
    (
        Key(
            "syntax",
            CHOICE,
            "The sbatch options that ask for GPUs: `gres` (`--gres=gpu:TYPE:N` per node), "
            "`gres+constraint` (`--gres=gpu:N --constraint=FEATURE`), `gpus-per-node` "
            "(`--gpus-per-node=TYPE:N`), `gpus` (`--gpus=TYPE:N`, the job's total), "
            "`gpus-per-task` (one task per GPU: `--ntasks-per-node=N --gpus-per-task=TYPE:1`), "
            "`none` (no GPU option: each GPU partition gives whole nodes, `gpus_per_node` says "
            "how many).",
            required=True,
            choices=_syntax_names,
            example="gres",
        ),
        Key(
            "type_required",
            BOOLEAN,
            "Every request names a GRES type, so every model needs `gres_type`.",
            default="false",
        ),
        Key(
            "cpus",
            CHOICE,
            "How CPUs are asked for: `cpus-per-gpu` (`--cpus-per-gpu=C`), or `cpus-per-task` "
            "(`--ntasks-per-node=` the GPUs per node and `--cpus-per-task=C`, as sites that "
            "document one task per GPU write it). C is `cpus_per_gpu`.",
            default="cpus-per-gpu",
            choices=_model_constants("CPU_FORMS"),
        ),
        Key(
            "memory",
            CHOICE,
            "How memory is asked for: `mem-per-gpu` (`--mem-per-gpu=M`), or `mem` (`--mem=` "
            "M times the GPUs per node). M is `mem_per_gpu`.",
            default="mem-per-gpu",
            choices=_model_constants("MEMORY_FORMS"),
        ),
        Key(
            "multi_node",
            CHOICE,
            "The `gpus` syntax over several nodes: `per-node` writes `--gpus-per-node=TYPE:N` "
            "(Slurm may split a `--gpus` total unevenly), `total` keeps `--gpus=TYPE:N*nodes` "
            "and says so at submit.",
            default="per-node",
            choices=_model_constants("MULTI_NODE_FORMS"),
        ),
    ),
)

QOS_RULE = Section(
    "qos_rule",
    "defaults.qos_by_time[]",
    "A QoS for jobs up to a length; the first entry whose `max_time` holds the job's time "
    "(its `--time`, else `defaults.time`) is taken.",
    (
        Key(
            "max_time",
            STRING,
            "The longest job this QoS takes.",
            required=True,
            pattern=TIME_PATTERN,
            example='"2:00:00"',
        ),
        Key(
            "qos",
            NULLABLE_STRING,
            "The QoS written as `--qos`; null: none written, for the jobs the QoS Slurm "
            "gives by default takes (a job script that names none, as documented).",
            required=True,
        ),
    ),
)

DEFAULTS = Section(
    "defaults",
    "defaults",
    "What a job gets when the user does not say. The same keys at the top, per partition and "
    "per model; precedence: site < partition < model < the user's option.",
    (
        Key(
            "account",
            STRING,
            "`--account`; `{project}` in it is the user's `--project` (`{project}@a100`).",
        ),
        Key("qos", STRING, "`--qos`."),
        Key(
            "qos_by_time",
            LIST,
            "The QoS chosen by the job's time, shortest first (instead of `qos`).",
            section=QOS_RULE,
        ),
        Key(
            "time",
            STRING,
            "The `--time` of a job that gives none (sites whose own default is minutes end "
            "such jobs early); at most the partition's `time_limit`.",
            pattern=TIME_PATTERN,
            example='"1:00:00"',
        ),
        Key("cpus_per_gpu", INTEGER, "CPUs per GPU (GPU jobs only).", minimum=1),
        Key(
            "mem_per_gpu",
            STRING,
            "Memory per GPU, a Slurm size (GPU jobs only).",
            pattern=MEMORY_PATTERN,
            example="64G",
        ),
        Key(
            "gres",
            STRING_LIST,
            "Extra GRES (`nvme:10`), merged into the GPU request's one `--gres` value; the "
            "user's `--gres` of the same name replaces it.",
            pattern=r"^[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?(:[0-9]+[KMGTP]?)?$",
        ),
        Key(
            "sbatch",
            STRING_LIST,
            "Extra `#SBATCH` options (`--hint=nomultithread`); a more specific one, or the "
            "user's `--sbatch-arg`, with the same option name replaces it. Options clusterjob "
            "writes itself are refused (each has its key).",
            pattern="^-",
        ),
        Key(
            "tasks_per_node",
            INTEGER,
            "`--ntasks-per-node` of a job that gives no `--tasks-per-node` (nodes shared among "
            "tasks, e.g. through CUDA MPS); more than one starts the program with srun.",
            minimum=1,
        ),
        Key(
            "cpus_per_task",
            INTEGER,
            "`--cpus-per-task`, written instead of CPUs per GPU (one choice with "
            "`cpus_per_gpu`: a layer that sets either replaces both).",
            minimum=1,
        ),
        Key(
            "max_requeues",
            INTEGER,
            "How often a job that gives no `--max-requeues` may be requeued (preemption, node "
            "failure); an attempt past it stops at once and says so. Default 3.",
            minimum=0,
        ),
    ),
    also_at=("partitions.NAME.defaults", "models.NAME.defaults"),
)

QOS = Section(
    "qos",
    "qos.NAME",
    "A QoS a job names beside its partition (`--qos devel --partition=accel`), by Slurm "
    "name, and its limits: a job over them is refused at submit, naming the limit.",
    (
        Key(
            "max_time",
            STRING,
            "The longest `--time` it takes (MaxWall).",
            pattern=TIME_PATTERN,
            example='"2:00:00"',
        ),
        Key(
            "max_gpus_per_job",
            INTEGER,
            "The most GPUs one job may ask for with it (MaxTRESPerJob=gres/gpu).",
            minimum=1,
        ),
        Key(
            "max_nodes",
            INTEGER,
            "The most nodes one job may ask for with it (MaxTRESPerJob=node).",
            minimum=1,
        ),
        Key(
            "partitions",
            STRING_LIST,
            "The partitions it is used with (a job naming it and no partition goes to the "
            "first of them with its model); absent: any.",
        ),
    ),
)

MODEL = Section(
    "model",
    "models.NAME",
    "One GPU model, under its canonical name (matched case-insensitively, as its aliases).",
    (
        Key("aliases", STRING_LIST, "Other names `--model` accepts, case-insensitively."),
        Key(
            "gres_type",
            NULLABLE_STRING,
            "This site's GRES type name (`Type=` in gres.conf), e.g. `a100` or "
            "`nvidia_a100-sxm4-80gb`; null: untyped GRES. On a Grid Engine site "
            "(`scheduler: gridengine`): the host's `gpu_type` value, asked for as "
            "`-l gpu_type=NAME`.",
            pattern=GRES_TYPE_PATTERN,
        ),
        Key(
            "nvml_names",
            STRING_LIST,
            "NVML device names that identify this model on a node (exact, case-insensitive); "
            "required for NVIDIA models.",
            required_unless=("vendor", "amd"),
        ),
        Key(
            "vendor",
            CHOICE,
            "The GPU's maker: the node checks read NVIDIA GPUs through NVML; AMD GPUs "
            "(`/dev/dri/renderD*` in gres.conf) cannot be checked, so their jobs need "
            "`preflight: warn` or `off`.",
            default="nvidia",
            choices=_model_constants("VENDORS"),
        ),
        Key(
            "defaults",
            SECTION,
            "Job defaults for this model, over the partition's.",
            section=DEFAULTS,
        ),
        Key(
            "gres_type_overlap",
            BOOLEAN,
            "Its GRES type is a substring of another's on purpose (vendor MIG names): no warning.",
            default="false",
        ),
        Key("memory_gb", INTEGER, "GPU memory in GB (shown by `site show`).", minimum=1),
        Key(
            "max_per_job",
            INTEGER,
            "The most of this model one job may ask for (e.g. MIG slices: a job that needs "
            "more should ask for whole GPUs).",
            minimum=1,
        ),
        Key(
            "constraint",
            NULLABLE_STRING,
            "The node feature that selects this model (`--constraint`), e.g. `a100`, "
            "`GPU_SKU:V100_SXM2` or `gpu&hbm80g`; required by the `gres+constraint` syntax, "
            "added to the request by every syntax. On a partition that holds other models "
            "too, a model needs a GRES type of its own or a constraint (and then no node "
            "holding it beside another model).",
            pattern=CONSTRAINT_PATTERN,
        ),
    ),
)

JOB = Section(
    "job",
    "job",
    "How jobs get their software when the user names no interpreter and has no env active: "
    "at most one of `python`, `venv`, `conda`; and shell lines every job runs first "
    "(the site's, then the partition's).",
    (
        Key("python", STRING, "An absolute interpreter path.", pattern="^/"),
        Key("venv", STRING, "A virtual environment's directory (its `bin/python`).", pattern="^/"),
        Key("conda", STRING, "A conda env name or prefix, activated with conda's shell hook."),
        Key("setup", STRING_LIST, "Shell lines, verbatim, one line each."),
    ),
    also_at=("partitions.NAME.job",),
)

CHECKS = Section(
    "checks",
    "checks",
    "What the node checks (Prolog and preflight) accept; a partition's entries apply over "
    "the site's.",
    (
        Key(
            "driver_min",
            STRING,
            "The oldest NVIDIA driver accepted.",
            pattern=DRIVER_VERSION_PATTERN,
            example='"535.104.05"',
        ),
        Key(
            "cuda_min",
            STRING,
            "The oldest CUDA version the driver must support (quoted).",
            pattern=CUDA_VERSION_PATTERN,
            example='"12.4"',
        ),
        Key(
            "severity",
            NAMED_CHOICE,
            "Per check id, a severity in place of the check's own.",
            choices=_severities,
        ),
    ),
    also_at=("partitions.NAME.checks",),
)

MODEL_GROUP = Section(
    "model_group",
    "model_groups.NAME",
    'Several models a job may take any one of ("any V100", 16 or 32 GB): `--model NAME` '
    "asks for the GRES type they share, or for the OR of their node features in brackets "
    "(`[v100-16g|v100-32g]`: every node of the job the same one; a feature with `&` or `|` is "
    "one option in parentheses, `[(gpu&hbm40g)|v100]`, so a member's feature has no brackets "
    "or parentheses of its own).",
    (
        Key("aliases", STRING_LIST, "Other names `--model` accepts, case-insensitively."),
        Key("models", STRING_LIST, "The models it stands for (canonical names).", required=True),
    ),
)

PARTITION = Section(
    "partition",
    "partitions.NAME",
    "One Slurm partition clusterjob may submit to.",
    (
        Key(
            "nodes",
            STRING,
            "Its nodes, a Slurm hostlist; each must be in `node_map`.",
            required=True,
            example='"gpu-a[01-16]"',
        ),
        Key(
            "time_limit",
            STRING,
            "The longest `--time` it takes (a Slurm time).",
            pattern=TIME_PATTERN,
            example='"2-00:00:00"',
        ),
        Key(
            "default",
            BOOLEAN,
            "The partition tried first when the user names none (at most one).",
            default="false",
        ),
        Key("defaults", SECTION, "Job defaults over the site's.", section=DEFAULTS),
        Key("checks", SECTION, "Node-check policy over the site's.", section=CHECKS),
        Key("job", SECTION, "Interpreter and setup lines over the site's.", section=JOB),
        Key(
            "submit_as",
            CHOICE,
            "How the partition is named to Slurm: `partition` (`--partition=NAME`), `qos` "
            "(`--qos=NAME`: the QoS is the queue; `--qos NAME` also picks it), `none` "
            "(nothing: the site routes jobs by size and length).",
            default="partition",
            choices=_model_constants("SUBMIT_AS"),
        ),
        Key("max_gpus_per_job", INTEGER, "The most GPUs one job may ask for here.", minimum=1),
        Key(
            "gpus_per_node",
            INTEGER,
            "Jobs get exactly this many GPUs per node (whole-node partitions).",
            minimum=1,
        ),
        Key("max_nodes", INTEGER, "The most nodes one job may ask for here.", minimum=1),
        Key(
            "account",
            CHOICE,
            "Whether jobs here must name an account, over the site's `account`.",
            choices=_model_constants("ACCOUNT_RULES"),
        ),
        Key(
            "preflight",
            CHOICE,
            "The job's GPU check here, over the site's `preflight`.",
            choices=_model_constants("PREFLIGHT_MODES"),
        ),
    ),
)

GPU_SLOT = Section(
    "gpu_slot",
    "node_map[].gpus[]",
    "One GPU of the node, in PCI bus order: slot i is Slurm's GRES index i.",
    (
        Key("model", STRING, "A model's canonical name.", required=True),
        Key(
            "bus_id",
            STRING,
            "Its PCI bus ID; slots in ascending order.",
            pattern=BUS_ID_PATTERN,
            example='"0000:3b:00.0"',
        ),
        Key("uuid", STRING, "Its NVML UUID (one-node entries only).", pattern=UUID_PATTERN),
        Key("nvlinks", INTEGER, "NVLink links that must be active.", minimum=0, maximum=36),
        Key(
            "mig",
            STRING_LIST,
            "The MIG profiles of its slices (e.g. `1g.10gb`), each with `@GI`, its GPU "
            "instance id (`nvidia-smi mig -lgi`), where gres.conf should name its device "
            "files (`3g.40gb@1`); Slurm GRES indices count the slices. `[]`: MIG off; "
            "absent: any.",
            pattern=MIG_SLICE_PATTERN,
        ),
    ),
)

NODE_ENTRY = Section(
    "node_entry",
    "node_map[]",
    "Nodes with one GPU layout.",
    (
        Key("nodes", STRING, "A Slurm hostlist.", required=True, example='"ml-gpu[01-04]"'),
        Key(
            "gpus",
            LIST,
            "Each GPU of these nodes, in PCI bus order.",
            required=True,
            section=GPU_SLOT,
        ),
        Key(
            "features",
            STRING_LIST,
            "Node features these nodes have beyond the models' constraints (Slurm's "
            "`Features=`), e.g. `[mps]` for `-C mps`; `sandbox up --like` gives them.",
            example="[mps, ib]",
        ),
    ),
)

PROLOG = Section(
    "prolog",
    "prolog",
    "The Slurm Prolog that checks a node's GPUs before every job.",
    (
        Key(
            "on_error",
            CHOICE,
            "When the GPUs cannot be checked: `drain` the node, or `pass` with a warning.",
            default="drain",
            choices=_on_error,
        ),
        Key(
            "deadline_seconds",
            NUMBER,
            "The Prolog's own deadline, well under PrologEpilogTimeout.",
            default="20",
        ),
        Key("log", STRING, "Its JSON-lines log.", default="/var/log/clusterjob/prolog.jsonl"),
    ),
)

SITE = Section(
    "site",
    "",
    "The site file's top level.",
    (
        Key("site", STRING, "The site's name.", required=True),
        Key(
            "scheduler",
            CHOICE,
            "The batch scheduler the site runs: `slurm`, or `gridengine` (Son of Grid Engine "
            "8.1: GPUs asked for as the consumable `gpu` and the string complex `gpu_type`, "
            "partitions as queues).",
            default="slurm",
            choices=_model_constants("SCHEDULERS"),
        ),
        Key(
            "cluster_name",
            NULLABLE_STRING,
            "Slurm's ClusterName: the site is found by it when no file is named.",
        ),
        Key(
            "node_command",
            NULLABLE_STRING,
            "How job scripts call clusterjob on a node (a command line).",
            default="the submitting interpreter's `python -m clusterjob`",
        ),
        Key(
            "gpu_request",
            SECTION,
            GPU_REQUEST.doc + " A Grid Engine site may leave it out: its GPUs are asked for as "
            "`-l gpu=N,gpu_type=T`, every model with its `gres_type` as the `gpu_type`.",
            required_unless=("scheduler", "gridengine"),
            section=GPU_REQUEST,
        ),
        Key(
            "models",
            NAMED,
            "The site's GPU models, by canonical name.",
            required=True,
            section=MODEL,
        ),
        Key(
            "model_groups",
            NAMED,
            "Names for several models at once, by group name.",
            section=MODEL_GROUP,
        ),
        Key("partitions", NAMED, "The partitions, by Slurm name.", section=PARTITION),
        Key(
            "node_map",
            LIST,
            "Each node's GPUs in PCI bus order.",
            required=True,
            section=NODE_ENTRY,
        ),
        Key("prolog", SECTION, PROLOG.doc, section=PROLOG),
        Key(
            "templates",
            STRING,
            "A directory beside this file whose job templates extend or override the shipped "
            "ones (it must exist).",
        ),
        Key("checks", SECTION, CHECKS.doc, section=CHECKS),
        Key("job", SECTION, "Interpreter and setup lines for every job.", section=JOB),
        Key("defaults", SECTION, "Job defaults of the whole site.", section=DEFAULTS),
        Key(
            "account",
            CHOICE,
            "`required`: a job with no account (`--account`, `--project` with an account "
            "pattern, a `defaults.account`, or `SBATCH_ACCOUNT` in the environment) is "
            "refused at submit, as the site's Slurm would. Partitions may say otherwise.",
            default="optional",
            choices=_model_constants("ACCOUNT_RULES"),
        ),
        Key("qos", NAMED, "QoS with limits, by Slurm name.", section=QOS),
        Key(
            "preflight",
            CHOICE,
            "The job's first step, which checks its GPUs against the node map: `required` "
            "(a failed or impossible check ends the job), `warn` (said on stderr, the job "
            "goes on), `off` (not run). Partitions may say otherwise.",
            default="required",
            choices=_model_constants("PREFLIGHT_MODES"),
        ),
    ),
)

SECTIONS: tuple[Section, ...] = (
    SITE,
    GPU_REQUEST,
    MODEL,
    MODEL_GROUP,
    PARTITION,
    DEFAULTS,
    QOS_RULE,
    QOS,
    JOB,
    CHECKS,
    NODE_ENTRY,
    GPU_SLOT,
    PROLOG,
)


# -- JSON Schema -------------------------------------------------------------------------------

SCHEMA_ID = "https://clusterjob.invalid/site-config.schema.json"


def _value_schema(key: Key) -> dict[str, Any]:
    kind = key.kind
    out: dict[str, Any]
    if kind == STRING:
        out = {"type": "string", "minLength": 1, "pattern": key.pattern or NON_EMPTY}
    elif kind == NULLABLE_STRING:
        out = {
            "anyOf": [
                {"type": "string", "minLength": 1, "pattern": key.pattern or NON_EMPTY},
                {"type": "null"},
            ]
        }
    elif kind == INTEGER:
        out = {"type": "integer"}
    elif kind == NUMBER:
        out = {"type": "number", "exclusiveMinimum": 0}
    elif kind == BOOLEAN:
        out = {"type": "boolean"}
    elif kind == CHOICE:
        out = {"type": "string", "enum": list(key.choice_values())}
    elif kind == STRING_LIST:
        item: dict[str, Any] = {
            "type": "string",
            "minLength": 1,
            "pattern": key.pattern or NON_EMPTY,
        }
        out = {"type": "array", "items": item}
    elif kind in (SECTION, NAMED, LIST):
        assert key.section is not None
        ref = {"$ref": f"#/definitions/{key.section.id}"}
        if kind == SECTION:
            out = dict(ref)
        elif kind == NAMED:
            out = {"type": "object", "additionalProperties": ref}
        else:
            out = {"type": "array", "items": ref}
    elif kind == NAMED_CHOICE:
        out = {"type": "object", "additionalProperties": {"enum": list(key.choice_values())}}
    else:  # pragma: no cover - a kind added above without its schema
        raise ValueError(f"no JSON Schema for kind {kind!r}")
    if key.minimum is not None:
        out["minimum"] = key.minimum
    if key.maximum is not None:
        out["maximum"] = key.maximum
    out["description"] = _plain(key.doc) + (f" Default: {key.default}." if key.default else "")
    if key.default is not None and kind in (BOOLEAN, CHOICE):
        out["default"] = key.default == "true" if kind == BOOLEAN else key.default
    return out


def _section_schema(section: Section) -> dict[str, Any]:
    out: dict[str, Any] = {
        "type": "object",
        "description": _plain(section.doc),
        "properties": {k.name: _value_schema(k) for k in section.keys},
        "additionalProperties": False,
    }
    required = [k.name for k in section.keys if k.required]
    if required:
        out["required"] = required
    conditional = [
        {
            "if": {
                "properties": {k.required_unless[0]: {"const": k.required_unless[1]}},
                "required": [k.required_unless[0]],
            },
            "else": {"required": [k.name]},
        }
        for k in section.keys
        if k.required_unless is not None
    ]
    if conditional:
        out["allOf"] = conditional
    return out


def _plain(text: str) -> str:
    return text.replace("`", "")


def json_schema() -> dict[str, Any]:
    """The site config as a JSON Schema (draft-07, which editors' YAML servers read).

    It says what can be said per key (types, choices, patterns, required keys, unknown keys);
    what needs the whole file (a model a node map names, a default partition's uniqueness)
    only ``clusterjob site validate`` checks."""
    top = _section_schema(SITE)
    definitions = {s.id: _section_schema(s) for s in SECTIONS if s is not SITE}
    severity = definitions["checks"]["properties"]["severity"]
    severity["propertyNames"] = {"enum": list(_check_ids())}
    rules = _syntax_rules()
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": SCHEMA_ID,
        "title": "clusterjob site config",
        **top,
        **({"allOf": rules} if rules else {}),
        "definitions": definitions,
    }


def _syntax_rules() -> list[dict[str, Any]]:
    """What each request syntax needs of every model (``gres_type`` where types are required,
    ``constraint`` for gres+constraint), asked of the syntaxes themselves: a model with
    neither key shows each syntax's gaps."""
    from clusterjob.site.gpu_syntax import syntax_named
    from clusterjob.site.model import GpuModel

    bare = GpuModel("x", (), None, ())
    rules: list[dict[str, Any]] = []
    for name in _syntax_names():
        syntax = syntax_named(name)
        for typed in (False, True):
            needed = sorted({gap.key for gap in syntax.gaps(bare, typed)})
            if not needed or (
                typed and needed == sorted({g.key for g in syntax.gaps(bare, False)})
            ):
                continue
            request: dict[str, Any] = {"syntax": {"const": name}}
            required = ["syntax"]
            if typed:
                request["type_required"] = {"const": True}
                required.append("type_required")
            rules.append(
                {
                    "if": {
                        "properties": {
                            "gpu_request": {"properties": request, "required": required}
                        },
                        "required": ["gpu_request"],
                    },
                    "then": {
                        "properties": {
                            "models": {
                                "additionalProperties": {
                                    "required": needed,
                                    "properties": {k: {"type": "string"} for k in needed},
                                }
                            }
                        }
                    },
                }
            )
    return rules


# -- the key reference -------------------------------------------------------------------------


def _type_text(key: Key) -> str:
    if key.kind == CHOICE:
        return "one of " + ", ".join(f"`{c}`" for c in key.choice_values())
    if key.kind in (SECTION, NAMED, LIST):
        assert key.section is not None
        anchor = _anchor(key.section)
        if key.kind == SECTION:
            return f"[mapping](#{anchor})"
        if key.kind == NAMED:
            return f"name → [mapping](#{anchor})"
        return f"list of [mappings](#{anchor})"
    if key.kind == NAMED_CHOICE:
        return "check id → " + " / ".join(f"`{c}`" for c in key.choice_values())
    text = key.kind
    if key.minimum is not None and key.maximum is not None:
        text += f" {key.minimum}..{key.maximum}"
    elif key.minimum is not None:
        text += f" ≥ {key.minimum}"
    return text


def _anchor(section: Section) -> str:
    return "top-level" if not section.path else section.id.replace("_", "-")


def _default_text(default: str | None) -> str:
    if default is None:
        return "—"
    return default if " " in default or "`" in default else f"`{default}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """The key reference page (Markdown): one table per section, generated from the one
    definition above, so it cannot drift from what the loader accepts."""
    out = [
        "# Site config reference",
        "",
        "<!-- Generated by clusterjob.site.schema.reference_markdown(); do not edit. -->",
        "",
        "Every key a site file may have, section by section. Unknown keys are errors; "
        "`clusterjob site validate FILE` reports every problem as `file:line: key.path: "
        "message`. `clusterjob site schema` prints the same definition as a JSON Schema for "
        "editors: put `# yaml-language-server: $schema=site-config.schema.json` on the first "
        "line of a site file.",
        "",
    ]
    for section in SECTIONS:
        title = "Top level" if not section.path else f"`{section.path}`"
        out += [f"## {title}", "", f'<a id="{_anchor(section)}"></a>', ""]
        out.append(section.doc)
        if section.also_at:
            out.append("Also at: " + ", ".join(f"`{p}`" for p in section.also_at) + ".")
        out += ["", "| key | type | required / default | meaning |", "|---|---|---|---|"]
        for key in section.keys:
            need = "required" if key.required else _default_text(key.default)
            if key.required_unless is not None:
                need = f"required unless `{key.required_unless[0]}: {key.required_unless[1]}`"
            meaning = key.doc
            if key.example:
                meaning += f" Example: `{key.example}`."
            out.append(
                f"| `{key.name}` | {_cell(_type_text(key))} | {_cell(need)} | {_cell(meaning)} |"
            )
        out.append("")
    if out[-1] == "":
        out.pop()
    return "\n".join(out) + "\n"


def key_tables() -> Mapping[str, dict[str, bool]]:
    """Section id -> its key table (for tests and the loader)."""
    return {s.id: s.key_table() for s in SECTIONS}


__all__ = [
    "SECTIONS",
    "Key",
    "Section",
    "json_schema",
    "key_tables",
    "reference_markdown",
]
