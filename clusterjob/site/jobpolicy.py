"""Reading what a site asks of every job: ``defaults`` (top, per partition, per model), a
partition's limits and how it is named to Slurm, the request's CPU and memory forms, and the
cross-checks between them (a default time past the limit, a whole-node size no node has).

Part of the site loader (``clusterjob.site.loader`` calls these); the keys and their meaning
are in ``clusterjob.site.schema``. Every problem is recorded on the ``Validator`` with its
line; a value that failed comes back as ``INVALID``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import hostlist

from clusterjob.site import schema
from clusterjob.site.model import (
    ACCOUNT_RULES,
    CPU_FORMS,
    MEMORY_FORMS,
    MULTI_NODE_FORMS,
    PREFLIGHT_MODES,
    SUBMIT_AS,
    GpuModel,
    JobDefaults,
    ModelGroup,
    Partition,
    QosLimits,
    QosRule,
    RequestForm,
    nests_in_matching_or,
)
from clusterjob.site.yamlcheck import (
    INVALID,
    Entry,
    Invalid,
    Validator,
    join_path,
    key_line,
    line_of,
    read_key,
)
from clusterjob.slurm.syntax import MEMORY_SIZE, is_time, sbatch_option_name, time_seconds

_GRES_ITEM = re.compile(schema.DEFAULTS.key("gres").pattern or "")
_PROJECT_FIELD = re.compile(r"\{[^}]*\}")
# Options clusterjob writes itself, and the key or option that sets each instead.
_OWN_OPTIONS = {
    "--partition": "the partition (submit_as)",
    "-p": "the partition (submit_as)",
    "--nodes": "--nodes",
    "-N": "--nodes",
    "--time": "defaults.time",
    "-t": "defaults.time",
    "--account": "defaults.account",
    "-A": "defaults.account",
    "--qos": "defaults.qos",
    "-q": "defaults.qos",
    "--constraint": "the model's constraint",
    "-C": "the model's constraint",
    "--job-name": "--job-name",
    "-J": "--job-name",
    "--comment": "nothing (clusterjob's submission token is there)",
    "--gres": "defaults.gres (merged into the one --gres)",
    "--gpus": "gpu_request.syntax",
    "-G": "gpu_request.syntax",
    "--gpus-per-node": "gpu_request.syntax",
    "--gpus-per-task": "gpu_request.syntax",
    "--cpus-per-gpu": "defaults.cpus_per_gpu",
    "--cpus-per-task": "defaults.cpus_per_task",
    "-c": "defaults.cpus_per_task",
    "--mem-per-gpu": "defaults.mem_per_gpu",
    "--mem": "defaults.mem_per_gpu with gpu_request.memory: mem",
    "--ntasks-per-node": "defaults.tasks_per_node",
}


def read_time(
    v: Validator,
    fields: Mapping[str, Entry],
    key: str,
    path: str,
    *,
    what: str = "a Slurm time",
    example: str = "1:00:00, 2-00:00:00, 30",
) -> str | Invalid | None:
    """A key whose value is a Slurm time (``2-00:00:00``): the string, or ``INVALID`` after
    saying why at its line."""
    value = read_key(fields, key, v.string, path)
    if isinstance(value, str) and not is_time(value):
        v.error(
            key_line(fields, key),
            join_path(path, key),
            f"not {what}: {value!r} (e.g. {example})",
        )
        return INVALID
    return value


def read_defaults(v: Validator, entry: Entry | None, path: str) -> JobDefaults | Invalid:
    """``defaults:`` at the top, of a partition or of a model."""
    if entry is None:
        return JobDefaults()
    fields = v.mapping(entry.value, path, schema.DEFAULTS.key_table())
    if fields is None:
        return INVALID
    failed = False
    account = read_key(fields, "account", v.string, path)
    if isinstance(account, str):
        odd = [f for f in _PROJECT_FIELD.findall(account) if f != "{project}"]
        if odd:
            v.error(
                key_line(fields, "account"),
                join_path(path, "account"),
                f"unknown field {odd[0]}: the one field an account may hold is {{project}}",
            )
            failed = True
    qos = read_key(fields, "qos", v.string, path)
    cpus = read_key(fields, "cpus_per_gpu", lambda n, p: v.integer(n, p, minimum=1), path)
    tasks, cpus_per_task = (
        read_key(fields, key, lambda n, p: v.integer(n, p, minimum=1), path)
        for key in ("tasks_per_node", "cpus_per_task")
    )
    requeues = read_key(fields, "max_requeues", lambda n, p: v.integer(n, p, minimum=0), path)
    if isinstance(cpus, int) and isinstance(cpus_per_task, int):
        v.error(
            key_line(fields, "cpus_per_task"),
            join_path(path, "cpus_per_task"),
            "give cpus_per_gpu or cpus_per_task, not both",
        )
        failed = True
    mem = read_key(fields, "mem_per_gpu", v.string, path)
    if isinstance(mem, str) and not MEMORY_SIZE.match(mem):
        v.error(
            key_line(fields, "mem_per_gpu"),
            join_path(path, "mem_per_gpu"),
            f"not a Slurm memory size: {mem!r} (e.g. 64G, 500M, 1T)",
        )
        mem = INVALID
    time = read_time(v, fields, "time", path)
    rules = _read_qos_rules(v, fields.get("qos_by_time"), join_path(path, "qos_by_time"))
    if isinstance(qos, str) and rules:
        v.error(
            key_line(fields, "qos_by_time"),
            join_path(path, "qos_by_time"),
            "give qos or qos_by_time, not both",
        )
        failed = True
    gres = _read_items(v, fields.get("gres"), join_path(path, "gres"), _check_gres)
    sbatch = _read_items(v, fields.get("sbatch"), join_path(path, "sbatch"), _check_sbatch)
    values = (account, qos, cpus, mem, time, rules, gres, sbatch, tasks, cpus_per_task, requeues)
    if failed or any(x is INVALID for x in values):
        return INVALID
    assert not isinstance(rules, Invalid) and not isinstance(gres, Invalid)
    assert not isinstance(sbatch, Invalid)
    return JobDefaults(
        account=account if isinstance(account, str) else None,
        qos=qos if isinstance(qos, str) else None,
        cpus_per_gpu=cpus if isinstance(cpus, int) else None,
        mem_per_gpu=mem if isinstance(mem, str) else None,
        time=time if isinstance(time, str) else None,
        qos_by_time=rules,
        gres=gres,
        sbatch=sbatch,
        tasks_per_node=tasks if isinstance(tasks, int) else None,
        cpus_per_task=cpus_per_task if isinstance(cpus_per_task, int) else None,
        max_requeues=requeues if isinstance(requeues, int) else None,
    )


def _read_qos_rules(v: Validator, entry: Entry | None, path: str) -> tuple[QosRule, ...] | Invalid:
    if entry is None:
        return ()
    items = v.sequence(entry.value, path, "a list of {max_time, qos} entries, shortest first")
    if items is None:
        return INVALID
    rules: list[QosRule] = []
    previous: int | None = None
    failed = False
    for i, item in enumerate(items):
        ipath = f"{path}[{i}]"
        fields = v.mapping(item, ipath, schema.QOS_RULE.key_table())
        if fields is None:
            failed = True
            continue
        max_time = read_key(fields, "max_time", v.string, ipath)
        qos = read_key(fields, "qos", v.nullable_string, ipath)
        if not isinstance(max_time, str) or "qos" not in fields or qos is INVALID:
            failed = True
            continue
        if not is_time(max_time):
            v.error(
                key_line(fields, "max_time"),
                join_path(ipath, "max_time"),
                f"not a Slurm time: {max_time!r} (e.g. 2:00:00)",
            )
            failed = True
            continue
        seconds = time_seconds(max_time)
        length = seconds if seconds is not None else 1 << 62
        if previous is not None and length <= previous:
            v.error(
                key_line(fields, "max_time"),
                join_path(ipath, "max_time"),
                "list the QoS shortest first: the first whose max_time holds the job is taken",
            )
            failed = True
        previous = length
        rules.append(QosRule(max_time, qos))
    return INVALID if failed else tuple(rules)


def _read_items(
    v: Validator, entry: Entry | None, path: str, check: object
) -> tuple[str, ...] | Invalid:
    if entry is None:
        return ()
    items = v.string_list(entry.value, path)
    if items is None:
        return INVALID
    failed = False
    out = []
    for i, (text, node) in enumerate(items):
        problem = check(text)  # type: ignore[operator]
        if problem:
            v.error(line_of(node), f"{path}[{i}]", problem)
            failed = True
        out.append(text)
    return INVALID if failed else tuple(out)


def _check_gres(item: str) -> str | None:
    if not _GRES_ITEM.match(item):
        return f"not a GRES: {item!r} (NAME[:TYPE][:COUNT], e.g. nvme:10)"
    if item.split(":", 1)[0] == "gpu":
        return "GPUs are the request itself (gpu_request, --gpus, --model), not an extra GRES"
    return None


def _check_sbatch(arg: str) -> str | None:
    if "\n" in arg or "\r" in arg:
        return "one option per item"
    if not arg.startswith("-"):
        return f"not an sbatch option: {arg!r} (e.g. --hint=nomultithread)"
    name = sbatch_option_name(arg)
    if name in _OWN_OPTIONS:
        return f"{name} is written by clusterjob: set {_OWN_OPTIONS[name]} instead"
    return None


def read_choice(
    v: Validator, fields: Mapping[str, Entry], key: str, path: str, choices: tuple[str, ...]
) -> str | None | Invalid:
    return read_key(fields, key, lambda n, p: v.choice(n, p, choices), path)


def read_form(v: Validator, fields: Mapping[str, Entry]) -> RequestForm | Invalid:
    """``gpu_request``'s CPU, memory and multi-node forms."""
    path = "gpu_request"
    cpus = read_choice(v, fields, "cpus", path, CPU_FORMS)
    memory = read_choice(v, fields, "memory", path, MEMORY_FORMS)
    multi = read_choice(v, fields, "multi_node", path, MULTI_NODE_FORMS)
    if cpus is INVALID or memory is INVALID or multi is INVALID:
        return INVALID
    base = RequestForm()
    return RequestForm(
        cpus=cpus if isinstance(cpus, str) else base.cpus,
        memory=memory if isinstance(memory, str) else base.memory,
        multi_node=multi if isinstance(multi, str) else base.multi_node,
    )


def read_preflight(v: Validator, fields: Mapping[str, Entry], path: str) -> str | None | Invalid:
    return read_choice(v, fields, "preflight", path, PREFLIGHT_MODES)


def read_account_rule(v: Validator, fields: Mapping[str, Entry], path: str) -> str | None | Invalid:
    """``account: required`` (or ``optional``), at the top or of a partition."""
    return read_choice(v, fields, "account", path, ACCOUNT_RULES)


def read_qos_limits(
    v: Validator, entry: Entry | None, partitions: Mapping[str, Partition]
) -> tuple[QosLimits, ...]:
    """``qos:``: each QoS's limits, its partitions ones the site has (asked for by
    ``--partition``: a partition that is itself a QoS cannot stand beside another)."""
    if entry is None:
        return ()
    named = v.any_mapping(entry.value, "qos", "a mapping of QoS name to its limits")
    if named is None:
        return ()
    out: list[QosLimits] = []
    for name, item in named.items():
        path = join_path("qos", name)
        fields = v.mapping(item.value, path, schema.QOS.key_table())
        if fields is None:
            continue
        max_time = read_time(v, fields, "max_time", path, example="2:00:00")
        gpus, nodes = (
            read_key(fields, key, lambda n, p: v.integer(n, p, minimum=1), path)
            for key in ("max_gpus_per_job", "max_nodes")
        )
        named_partitions = read_key(fields, "partitions", v.string_list, path) or []
        failed = INVALID in (max_time, gpus, nodes)
        for i, (text, node) in enumerate(named_partitions):
            problem = _qos_partition_problem(partitions.get(text), text, partitions)
            if problem:
                v.error(line_of(node), f"{path}.partitions[{i}]", problem)
                failed = True
        queue = partitions.get(name)
        if queue is not None and queue.submit_as == "qos":
            v.error(
                line_of(item.key),
                path,
                f"partition {name} is asked for as this QoS (submit_as: qos): its limits are "
                "the partition's",
            )
            failed = True
        if failed:
            continue
        out.append(
            QosLimits(
                name,
                max_time=max_time if isinstance(max_time, str) else None,
                max_gpus_per_job=gpus if isinstance(gpus, int) else None,
                max_nodes=nodes if isinstance(nodes, int) else None,
                partitions=tuple(text for text, _ in named_partitions),
            )
        )
    return tuple(out)


def _qos_partition_problem(
    partition: Partition | None, name: str, partitions: Mapping[str, Partition]
) -> str | None:
    if partition is None:
        return f"unknown partition {name!r}; partitions: {', '.join(partitions) or 'none'}"
    if partition.submit_as != "partition":
        return (
            f"partition {name} is not named with --partition (submit_as: "
            f"{partition.submit_as}): no QoS can stand beside it"
        )
    return None


def read_partition_policy(
    v: Validator, fields: Mapping[str, Entry], path: str
) -> dict[str, object] | Invalid:
    """A partition's submit_as, limits and preflight, as Partition keyword arguments."""
    submit_as = read_choice(v, fields, "submit_as", path, SUBMIT_AS)
    preflight = read_preflight(v, fields, path)
    account = read_account_rule(v, fields, path)
    limits = {
        key: read_key(fields, key, lambda n, p: v.integer(n, p, minimum=1), path)
        for key in ("max_gpus_per_job", "gpus_per_node", "max_nodes")
    }
    if submit_as is INVALID or preflight is INVALID or INVALID in limits.values():
        return INVALID
    if account is INVALID:
        return INVALID
    out: dict[str, object] = {k: val for k, val in limits.items()}
    out["preflight"] = preflight
    out["account"] = account
    if isinstance(submit_as, str):
        out["submit_as"] = submit_as
    return out


def check_partition(
    v: Validator,
    partition: Partition,
    fields_lines: Mapping[str, int],
    name_line: int,
    gpu_counts: Mapping[str, int],
    site_defaults: JobDefaults,
    *,
    whole_nodes: bool = False,
) -> None:
    """Contradictions inside one partition: limits no job can meet, a default time past the
    limit, a whole-node size its nodes do not have. ``whole_nodes`` (the ``none`` syntax: no
    GPU option, the partition implies the GPUs): a GPU partition must say how many."""
    path = f"partitions.{partition.name}"

    def line(key: str) -> int:
        return fields_lines.get(key, name_line)

    if whole_nodes and partition.gpus_per_node is None and any(gpu_counts.values()):
        v.error(
            name_line,
            join_path(path, "gpus_per_node"),
            "required when gpu_request.syntax is none: the GPUs each job gets on a node "
            "(the preflight checks that many)",
        )

    exact = partition.gpus_per_node
    if exact is not None:
        short = sorted(n for n in partition.node_names if gpu_counts.get(n, exact) < exact)
        if short:
            v.error(
                line("gpus_per_node"),
                join_path(path, "gpus_per_node"),
                f"{exact} GPUs per node, but {hostlist.collect_hostlist(short)} "
                f"{'has' if len(short) == 1 else 'have'} fewer in the node map",
            )
        most = partition.max_gpus_per_job
        if most is not None and most < exact:
            v.error(
                line("max_gpus_per_job"),
                join_path(path, "max_gpus_per_job"),
                f"{most} is fewer than the {exact} GPUs per node every job here gets: no job fits",
            )
    if partition.max_nodes is not None and partition.max_nodes > len(partition.node_names):
        v.error(
            line("max_nodes"),
            join_path(path, "max_nodes"),
            f"{partition.max_nodes} nodes, but the partition has {len(partition.node_names)}",
        )
    default_time = partition.defaults.time or site_defaults.time
    if default_time and partition.time_limit:
        wanted, limit = time_seconds(default_time), time_seconds(partition.time_limit)
        if limit is not None and (wanted is None or wanted > limit):
            where = "defaults.time" if partition.defaults.time else "the site's defaults.time"
            v.error(
                line("defaults") if partition.defaults.time else line("time_limit"),
                join_path(path, "defaults.time" if partition.defaults.time else "time_limit"),
                f"{where} {default_time} is longer than the time_limit {partition.time_limit}",
            )


_CONSTRAINT = re.compile(schema.CONSTRAINT_PATTERN)


def constraint_problem(text: str) -> str | None:
    """A model's node feature expression: Slurm's operators only, brackets balanced."""
    if not _CONSTRAINT.fullmatch(text):
        return (
            f"not a node feature expression: {text!r} (features joined with & or |, "
            "grouped with ( ) or [ ])"
        )
    depth = 0
    for c in text:
        depth += c in "(["
        depth -= c in ")]"
        if depth < 0:
            break
    if depth != 0:
        return f"unbalanced brackets in {text!r}"
    return None


def read_model_groups(
    v: Validator,
    entry: Entry | None,
    models: list[GpuModel],
    syntax_name: str | None,
    type_required: bool,
    broken: frozenset[str] = frozenset(),
) -> tuple[ModelGroup, ...]:
    """``model_groups:``: each names models that exist, its names collide with no model's,
    and the site's syntax can ask for "any of them" (one shared GRES type, or every member
    with a node feature to OR). A member in ``broken`` (in the models section, refused
    there) leaves its group out unsaid: that model's own error is the one to fix."""
    if entry is None:
        return ()
    named = v.any_mapping(entry.value, "model_groups", "a mapping of group name to group")
    if named is None:
        return ()
    by_name = {m.name: m for m in models}
    taken = {n.casefold(): m.name for m in models for n in (m.name, *m.aliases)}
    groups: list[ModelGroup] = []
    for name, item in named.items():
        path = join_path("model_groups", name)
        fields = v.mapping(item.value, path, schema.MODEL_GROUP.key_table())
        if fields is None:
            continue
        aliases = read_key(fields, "aliases", v.string_list, path) or []
        members = read_key(fields, "models", v.string_list, path)
        if members is None:
            continue
        bad = False
        for i, (text, node) in enumerate([(name, item.key), *aliases]):
            if text.casefold() in taken:
                where = path if i == 0 else f"{path}.aliases[{i - 1}]"
                v.error(
                    line_of(node), where, f"{text!r} already names model {taken[text.casefold()]}"
                )
                bad = True
        found: list[GpuModel] = []
        refused = [text for text, _ in members if text in broken]
        for i, (text, node) in enumerate(members):
            if text in broken:
                continue
            if text not in by_name:
                v.error(
                    line_of(node),
                    f"{path}.models[{i}]",
                    f"unknown model {text!r}; defined models: {', '.join(by_name) or 'none'}",
                )
                bad = True
            else:
                found.append(by_name[text])
        line = key_line(fields, "models") or line_of(item.key)
        if not bad and len(found) + len(refused) < 2:
            v.error(line, join_path(path, "models"), "a group needs two models or more")
            bad = True
        if not bad and not refused:
            problem = _group_problem(found, syntax_name, type_required)
            if problem:
                v.error(line, join_path(path, "models"), problem)
                bad = True
        if not bad and not refused:
            groups.append(
                ModelGroup(name, tuple(a for a, _ in aliases), tuple(m.name for m in found))
            )
    return tuple(groups)


def _group_problem(
    members: list[GpuModel], syntax_name: str | None, type_required: bool
) -> str | None:
    types = {m.gres_type for m in members}
    features = all(m.constraint for m in members)
    if type_required and len(types) > 1 and syntax_name != "gres+constraint":
        return (
            "the models' GRES types differ and this site requires one in every request: a "
            "group is asked for by one shared type or by node features"
        )
    if len(types) > 1 and not features:
        return (
            "the models share no GRES type and not every one has a constraint: the group "
            "cannot be asked for as one request"
        )
    if syntax_name == "gres+constraint" and not features:
        return "with gres+constraint every model of a group needs its constraint"
    nested = next((m for m in members if not nests_in_matching_or(m.constraint or "")), None)
    if features and nested is not None:
        return (
            f"model {nested.name}'s constraint {nested.constraint!r} cannot be one option of "
            "the group's [A|B]: Slurm takes one set of brackets and no nested parentheses"
        )
    return None
