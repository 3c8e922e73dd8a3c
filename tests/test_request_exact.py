"""Request resolution, exact: every refusal's whole message, every resolved value.

test_request.py shows the GPU options per request syntax; this file pins the rest of
``resolve`` (and the helpers the CLI calls before it: sweeps, params, launcher, setup) to
exact strings and values, so that a changed word or a changed boundary is a failing test.
Only the public functions are called, so the tests hold across refactors of the module.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from test_request import A100, CONSTRAINT_SITE, GRES_SITE, H100, V100, make_site

from clusterjob.errors import ConfigError, UsageError
from clusterjob.jobscript.request import (
    JobRequest,
    check_setup,
    choose_launcher,
    params_task_args,
    program_argv,
    resolve,
    sweep_task_args,
    tasks_tuple,
)

DIRECTIVE_FIELDS = (
    "partition", "time", "account", "qos", "mem_per_gpu", "job_name", "array", "dependency",
    "output", "error", "signal", "exclude", "nodelist", "mail_type", "mail_user", "constraint",
)  # fmt: skip


def refusal(site=GRES_SITE, script: str = "train.py", **kw: object) -> str:
    """The whole message ``resolve`` refuses the request with."""
    with pytest.raises(UsageError) as info:
        resolve(site, JobRequest(script, **kw), choose_interpreter=False)  # type: ignore[arg-type]
    return str(info.value)


def resolved(site=GRES_SITE, script: str = "train.py", **kw: object):
    return resolve(site, JobRequest(script, **kw), choose_interpreter=False)  # type: ignore[arg-type]


# -- values that cannot be written into the script -------------------------------------------


@pytest.mark.parametrize("name", DIRECTIVE_FIELDS)
def test_each_directive_field_refuses_empty_and_line_breaks_by_its_option(name: str) -> None:
    option = "--" + name.replace("_", "-")
    kw = {"model": "A100", name: ""}
    assert refusal(**kw) == f"{option} must not be empty"
    kw[name] = "a\nb"
    assert refusal(**kw) == (
        f"line break in {option} is not allowed: 'a\\nb' "
        "(an #SBATCH directive must fit on one line)"
    )
    kw[name] = "a\rb"
    assert refusal(**kw).startswith(f"line break in {option} is not allowed: 'a\\rb'")
    kw[name] = "a\x00b"
    assert refusal(**kw) == f"NUL character in {option} is not allowed: 'a\\x00b'"


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(mem_per_gpu="64X"),
            "--mem-per-gpu '64X' is not a Slurm memory size (e.g. 64G, 500M)",
        ),
        (
            dict(mem_per_gpu=" 64G"),
            "--mem-per-gpu ' 64G' is not a Slurm memory size (e.g. 64G, 500M)",
        ),
        (
            dict(sbatch_args=("--exclusive", "exclusive")),
            "--sbatch-arg 'exclusive' is not an sbatch option (expected --name=value)",
        ),
        (
            dict(sbatch_args=("--x\n",)),
            "line break in --sbatch-arg is not allowed: '--x\\n' "
            "(an #SBATCH directive must fit on one line)",
        ),
        (dict(args=("ok", "a\x00b")), "NUL character in a job argument is not allowed: 'a\\x00b'"),
        (
            dict(task_args=(("--a=1",), ("--b", "x\x00")), array="%2"),
            "NUL character in a sweep argument is not allowed: 'x\\x00'",
        ),
        (dict(token="a b"), "bad submission token 'a b'"),
        (dict(token=""), "bad submission token ''"),
        (dict(token="x" * 65), f"bad submission token {'x' * 65!r}"),
        (dict(token="ab/"), "bad submission token 'ab/'"),
        (dict(nodes=0), "--nodes must be at least 1"),
        (dict(nodes=-3), "--nodes must be at least 1"),
        (dict(tasks_per_node=0), "--tasks-per-node must be at least 1"),
        (dict(gpus=-1), "--gpus must be 0 (a CPU-only job) or more"),
        (dict(cpus_per_gpu=0), "--cpus-per-gpu must be at least 1"),
        (
            dict(gpus=0, cpus_per_gpu=4, model=None),
            "--cpus-per-gpu asks for GPUs, but this is a CPU-only job (--gpus 0 or none): "
            "give --gpus N",
        ),
        (
            dict(gpus=0, mem_per_gpu="8G", model=None),
            "--mem-per-gpu asks for GPUs, but this is a CPU-only job (--gpus 0 or none): "
            "give --gpus N",
        ),
        (
            dict(gpus=0),
            "--model asks for GPUs, but this is a CPU-only job (--gpus 0 or none): give --gpus N",
        ),
    ],
)
def test_refusals_of_what_cannot_be_written(kw: dict, message: str) -> None:
    assert refusal(**{"model": "A100", **kw}) == message


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("", "no script given"),
        ("a\x00.py", "NUL character in the script path is not allowed: 'a\\x00.py'"),
    ],
)
def test_the_script_path_is_checked(script: str, message: str) -> None:
    assert refusal(script=script, model="A100") == message


@pytest.mark.parametrize(
    "kw",
    [
        dict(token="x" * 64),
        dict(token="a_B-9"),
        dict(nodes=1, tasks_per_node=1, cpus_per_gpu=1),
        dict(mem_per_gpu="500"),
        dict(mem_per_gpu="500M"),
        dict(sbatch_args=("-x",)),
    ],
)
def test_the_smallest_and_longest_accepted_values(kw: dict) -> None:
    job = resolved(model="A100", **kw)
    assert job.token == kw.get("token", job.request.token)
    assert job.cpus_per_gpu == kw.get("cpus_per_gpu", 8)


# -- model and partition -------------------------------------------------------------------

H100_NOWHERE = make_site(models=(A100, H100))  # H100 is a model, but no node has one


@pytest.mark.parametrize(
    ("site", "kw", "message"),
    [
        (
            H100_NOWHERE,
            dict(model="H100"),
            "no partition at site mllab has H100 nodes (check the site's partitions and node_map)",
        ),
        (
            H100_NOWHERE,
            dict(model="H100", partition="gpu"),
            "partition gpu at site mllab has no H100 nodes (it has: A100)",
        ),
        (
            GRES_SITE,
            dict(gpus=0, partition="gpus"),
            "unknown partition 'gpus' at site mllab (did you mean gpu?); valid partitions: gpu, "
            "debug, mixed, cpu",
        ),
        (
            GRES_SITE,
            dict(model="A100", exclude="gpu-a[01"),
            "--exclude: not a Slurm hostlist: 'gpu-a[01' (bad range: 'gpu-a[01')",
        ),
        (
            GRES_SITE,
            dict(model="A100", nodelist="gpu-a[01"),
            "--nodelist: not a Slurm hostlist: 'gpu-a[01' (bad range: 'gpu-a[01')",
        ),
    ],
)
def test_model_and_partition_refusals(site, kw: dict, message: str) -> None:
    got = refusal(site, **kw)
    if "hostlist" in message:  # the hostlist library words its own reason
        assert got.startswith(message.split(" (bad")[0] + " (")
    else:
        assert got == message


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(model="V100", gpus=2, nodes=3, exclude="gpu-v[01-02]"),
            "cannot give 2 V100 GPU(s) per node on 3 node(s) at site mllab: "
            "only 2 node(s) have 2 or more V100 GPUs outside --exclude; possible: "
            "partition gpu: V100: at most 2 per node (nodes gpu-v[01-04]), "
            "A100: at most 4 per node (nodes gpu-a[01-12]); "
            "partition debug: V100: at most 2 per node (nodes gpu-v[01-02]); "
            "partition mixed: V100: at most 2 per node (nodes mix01), "
            "A100: at most 2 per node (nodes mix01)",
        ),
        (
            dict(model="V100", gpus=2, partition="debug", exclude="gpu-v[01-02]"),
            "cannot give 2 V100 GPU(s) per node on 1 node(s) at site mllab in partition debug: "
            "no node has 2 V100 GPUs outside --exclude; possible: "
            "V100: at most 2 per node (nodes gpu-v[01-02])",
        ),
        (
            dict(model="A100", gpus=3, partition="mixed"),
            "cannot give 3 A100 GPU(s) per node on 1 node(s) at site mllab in partition mixed: "
            "no node has 3 A100 GPUs; possible: "
            "A100: at most 2 per node (nodes mix01), V100: at most 2 per node (nodes mix01)",
        ),
        (
            dict(model="A100", gpus=1, partition="mixed", nodelist="gpu-a01"),
            "cannot give 1 A100 GPU(s) per node on 1 node(s) at site mllab in partition mixed: "
            "--nodelist node(s) gpu-a01 cannot give 1 A100 GPUs each; possible: "
            "A100: at most 2 per node (nodes mix01), V100: at most 2 per node (nodes mix01)",
        ),
        (
            dict(model="A100", gpus=4, partition="gpu", nodelist="gpu-a[01-02]", exclude="gpu-a02"),
            "cannot give 4 A100 GPU(s) per node on 1 node(s) at site mllab in partition gpu: "
            "--nodelist node(s) gpu-a02 cannot give 4 A100 GPUs each outside --exclude; "
            "possible: A100: at most 4 per node (nodes gpu-a[01-12]), "
            "V100: at most 2 per node (nodes gpu-v[01-04])",
        ),
        (
            dict(model="A100", gpus=4, nodes=13),
            "cannot give 4 A100 GPU(s) per node on 13 node(s) at site mllab: "
            "only 12 node(s) have 4 or more A100 GPUs; possible: "
            "partition gpu: A100: at most 4 per node (nodes gpu-a[01-12]), "
            "V100: at most 2 per node (nodes gpu-v[01-04]); "
            "partition mixed: A100: at most 2 per node (nodes mix01), "
            "V100: at most 2 per node (nodes mix01)",
        ),
    ],
)
def test_impossible_requests_exactly(kw: dict, message: str) -> None:
    assert refusal(**kw) == message


def test_capacity_lists_the_larger_groups_first() -> None:
    site = make_site(models=(A100,))
    nodes = dict(site.node_map.nodes)
    nodes["gpu-a12"] = nodes["gpu-a12"][:2]  # one node with only 2 A100s
    nodes["gpu-a11"] = nodes["gpu-a11"][:1]
    site = replace(site, node_map=replace(site.node_map, nodes=nodes))
    assert refusal(site, gpus=4, nodes=11, partition="gpu") == (
        "cannot give 4 A100 GPU(s) per node on 11 node(s) at site mllab in partition gpu: "
        "only 10 node(s) have 4 or more A100 GPUs; possible: A100: at most "
        "4 per node (nodes gpu-a[01-10]), 2 per node (nodes gpu-a12), 1 per node (nodes gpu-a11)"
    )


@pytest.mark.parametrize(
    ("kw", "partition", "eligible"),
    [
        (dict(model="V100"), "gpu", ("gpu-v01", "gpu-v02", "gpu-v03", "gpu-v04")),
        (dict(model="V100", gpus=2, nodes=4), "gpu", ("gpu-v01", "gpu-v02", "gpu-v03", "gpu-v04")),
        (dict(model="A100", gpus=3), "gpu", tuple(f"gpu-a{i:02}" for i in range(1, 13))),
        (dict(model="A100", nodelist="mix01"), "mixed", ("mix01",)),
        (dict(model="A100", gpus=2, nodelist="mix01"), "mixed", ("mix01",)),
        (dict(model="V100", partition="debug", exclude="gpu-v01"), "debug", ("gpu-v02",)),
        (
            dict(model="V100", nodes=2, nodelist="gpu-v02", exclude="gpu-v01"),
            "gpu",
            ("gpu-v02", "gpu-v03", "gpu-v04"),
        ),
    ],
)
def test_the_partition_and_its_eligible_nodes(kw: dict, partition: str, eligible: tuple) -> None:
    job = resolved(**kw)
    assert job.partition.name == partition
    assert job.eligible_nodes == eligible


def test_without_a_default_partition_the_first_that_fits_in_file_order() -> None:
    site = replace(
        GRES_SITE,
        partitions=tuple(replace(p, default=p.name == "mixed") for p in GRES_SITE.partitions),
    )
    # the default (mixed) first, where it fits
    assert resolved(site, model="V100").partition.name == "mixed"
    # it does not fit there: then file order
    assert resolved(site, model="V100", nodes=2).partition.name == "gpu"


# -- CPU-only jobs -------------------------------------------------------------------------


def test_a_cpu_only_job_takes_the_default_partition_and_its_non_gpu_defaults() -> None:
    job = resolved(gpus=0)
    assert job.model is None
    assert job.partition.name == "gpu"
    assert job.gres.options == ()
    assert (job.gres.per_node, job.gres.nodes, job.gres.gres_type) == (0, 1, None)
    assert (job.account, job.qos, job.cpus_per_gpu, job.mem_per_gpu) == ("ml", "normal", None, None)
    assert job.gpus_per_node == 0
    assert len(job.eligible_nodes) == 16


@pytest.mark.parametrize(
    ("kw", "partition", "eligible"),
    [
        (dict(partition="cpu"), "cpu", ("cpu01", "cpu02", "cpu03", "cpu04")),
        (dict(partition="cpu", nodes=4), "cpu", ("cpu01", "cpu02", "cpu03", "cpu04")),
        (dict(partition="cpu", exclude="cpu0[1-2]", nodes=2), "cpu", ("cpu03", "cpu04")),
        (dict(partition="debug", constraint="ib"), "debug", ("gpu-v01", "gpu-v02")),
    ],
)
def test_a_cpu_only_jobs_partition(kw: dict, partition: str, eligible: tuple) -> None:
    job = resolved(gpus=0, **kw)
    assert job.partition.name == partition
    assert job.eligible_nodes == eligible
    assert job.constraint == kw.get("constraint")
    assert job.nodes == kw.get("nodes", 1)


def test_a_cpu_only_job_without_a_default_takes_the_first_partition() -> None:
    site = replace(
        GRES_SITE, partitions=tuple(replace(p, default=False) for p in GRES_SITE.partitions)
    )
    assert resolved(site, gpus=0).partition.name == "gpu"
    site = replace(site, partitions=site.partitions[::-1])
    assert resolved(site, gpus=0).partition.name == "cpu"


@pytest.mark.parametrize(
    ("site", "kw", "message"),
    [
        (
            GRES_SITE,
            dict(partition="cpu", nodes=5),
            "cannot give 5 node(s) in partition cpu at site mllab: it has 4",
        ),
        (
            GRES_SITE,
            dict(partition="cpu", nodes=3, exclude="cpu[01-02]"),
            "cannot give 3 node(s) in partition cpu at site mllab: it has 2",
        ),
        (
            replace(GRES_SITE, partitions=()),
            dict(),
            "site mllab has no partitions for a CPU-only job",
        ),
    ],
)
def test_cpu_only_refusals(site, kw: dict, message: str) -> None:
    assert refusal(site, gpus=0, **kw) == message


# -- constraints and the site's GPU options ---------------------------------------------------


@pytest.mark.parametrize("bad", ["[ib]", "a]", "ib*2"])
def test_a_constraint_that_cannot_be_joined_with_and(bad: str) -> None:
    assert refusal(CONSTRAINT_SITE, model="A100", constraint=bad) == (
        f"cannot combine --constraint {bad!r} with the 'a100' node feature this site uses to "
        "select the GPU model; use '&', '|' and parentheses in --constraint here"
    )


def test_an_or_constraint_is_grouped_before_it_is_joined() -> None:
    """``a100&ib|eth`` would mean ``(a100&ib)|eth``: the user's OR is parenthesised."""
    assert resolved(CONSTRAINT_SITE, model="A100", constraint="ib|eth").gres.options[-1] == (
        "--constraint=a100&(ib|eth)"
    )


def test_the_site_cannot_express_the_model() -> None:
    site = make_site("gres", models=(replace(A100, gres_type=None),))
    with pytest.raises(ConfigError) as info:
        resolved(site, model="A100")
    (issue,) = info.value.issues
    assert (issue.file, issue.line, issue.key_path) == (
        "/etc/clusterjob/mllab.yaml",
        None,
        "models.A100.gres_type",
    )
    assert issue.message


# -- time ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("time", "partition", "message"),
    [
        ("2-00:00:01", "gpu", "--time 2-00:00:01 is longer than partition gpu's limit "),
        ("UNLIMITED", "gpu", "--time UNLIMITED is longer than partition gpu's limit "),
        ("61", "debug", "--time 61 is longer than partition debug's limit "),
        ("1 ", "gpu", "--time: "),
    ],
)
def test_a_time_over_the_partitions_limit(time: str, partition: str, message: str) -> None:
    model = "V100" if partition == "debug" else "A100"
    got = refusal(model=model, time=time, partition=partition)
    limit = {"gpu": "2-00:00:00", "debug": "01:00:00"}[partition]
    if message.endswith("limit "):
        assert got == f"{message}{limit} at site mllab"
    else:
        assert got == ("--time: not a Slurm time: '1 ' (expected minutes, HH:MM:SS or D-HH:MM:SS)")


@pytest.mark.parametrize(
    ("time", "partition"),
    [("2-00:00:00", "gpu"), ("60", "debug"), ("1:00:00", "debug"), ("UNLIMITED", "mixed")],
)
def test_a_time_up_to_the_limit_or_in_a_partition_without_one(time: str, partition: str) -> None:
    job = resolved(model="V100", time=time, partition=partition)
    assert job.time == time


# -- arrays, sweeps, signals -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "array", "signal", "notes"),
    [
        (dict(array="0-9%2"), "0-9%2", None, ()),
        (dict(task_args=(("--a=1",), ("--a=2",), ("--a=3",))), "0-2", None, ()),
        (dict(task_args=(("--a=1",), ("--a=2",)), array="%4"), "0-1%4", None, ()),
        (dict(task_args=(("--a=1",),), array="%10"), "0-0%10", None, ()),
        (
            dict(signal="USR1@90"),
            None,
            "B:USR1@90",
            (
                "--signal USR1@90 sent as B:USR1@90: a single-node job's program runs in the "
                "batch shell, where only B: signals arrive",
            ),
        ),
        (dict(signal="B:USR1@90"), None, "B:USR1@90", ()),
        (dict(signal="USR1@90", nodes=2), None, "USR1@90", ()),
        (dict(signal="R:TERM"), None, "R:TERM", ()),
        (
            dict(signal="10"),
            None,
            "B:10",
            (
                "--signal 10 sent as B:10: a single-node job's program runs in the batch "
                "shell, where only B: signals arrive",
            ),
        ),
    ],
)
def test_arrays_and_signals(kw: dict, array: str | None, signal: str | None, notes: tuple) -> None:
    job = resolved(model="V100", **kw)
    assert job.request.array == array
    assert job.request.signal == signal
    assert job.notes == notes


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(task_args=(("--a=1",),), array="0-3"),
            "--array '0-3' with --sweep/--params: the tasks come from the sweep; give only a "
            "limit of tasks running at once, e.g. --array %4",
        ),
        (
            dict(task_args=(("--a=1",),), array="%4x"),
            "--array '%4x' with --sweep/--params: the tasks come from the sweep; give only a "
            "limit of tasks running at once, e.g. --array %4",
        ),
        (dict(array="0-3%x"), "--array: '0-3%x': the %N task limit must be a number"),
        (dict(signal="USR1@"), "--signal 'USR1@': expected [B:]SIG[@SECONDS], e.g. USR1@90"),
        (dict(signal="US R1"), "--signal 'US R1': expected [B:]SIG[@SECONDS], e.g. USR1@90"),
        (dict(signal="B:@9"), "--signal 'B:@9': expected [B:]SIG[@SECONDS], e.g. USR1@90"),
    ],
)
def test_array_and_signal_refusals(kw: dict, message: str) -> None:
    assert refusal(model="V100", **kw) == message


def test_a_bad_array_says_why() -> None:
    assert refusal(model="V100", array="x").startswith("--array: ")


@pytest.mark.parametrize(
    ("sweeps", "tasks"),
    [
        ([], ((),)),
        (["lr=1e-4"], (("--lr=1e-4",),)),
        (
            ["lr=1e-4,3e-4", "bs=32,64"],
            (
                ("--lr=1e-4", "--bs=32"),
                ("--lr=1e-4", "--bs=64"),
                ("--lr=3e-4", "--bs=32"),
                ("--lr=3e-4", "--bs=64"),
            ),
        ),
        (["_x.y-z=a=b"], (("--_x.y-z=a=b",),)),
        (["N9=1"], (("--N9=1",),)),
    ],
)
def test_sweeps_are_the_product_with_the_last_fastest(sweeps: list[str], tasks: tuple) -> None:
    assert sweep_task_args(sweeps) == tasks


@pytest.mark.parametrize(
    ("sweeps", "message"),
    [
        (["lr"], "--sweep 'lr': expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4)"),
        (["=1,2"], "--sweep '=1,2': expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4)"),
        (["9lr=1"], "--sweep '9lr=1': expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4)"),
        (["l r=1"], "--sweep 'l r=1': expected NAME=V1,V2,... (e.g. lr=1e-4,3e-4)"),
        (["lr=1", "lr=2"], "--sweep lr is given twice; list all its values in one"),
        (["lr=1,,2"], "--sweep 'lr=1,,2': an empty value (two commas, or a trailing one)"),
        (["lr=1,"], "--sweep 'lr=1,': an empty value (two commas, or a trailing one)"),
        (["lr="], "--sweep 'lr=': an empty value (two commas, or a trailing one)"),
    ],
)
def test_sweep_refusals(sweeps: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        sweep_task_args(sweeps)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "tasks"),
    [
        ("--lr 1e-4\n--lr 3e-4\n", (("--lr", "1e-4"), ("--lr", "3e-4"))),
        ("  # a comment\n\n   \n--name 'run one'\n", (("--name", "run one"),)),
        ('["--x", "a b"]\n  ["y"]  \n', (("--x", "a b"), ("y",))),
        ("[]\n", ((),)),
        ("a#b\n", (("a#b",),)),
    ],
)
def test_params_one_task_per_line(text: str, tasks: tuple) -> None:
    assert params_task_args(text) == tasks


@pytest.mark.parametrize(
    ("text", "source", "message"),
    [
        ("", "--params", "--params: no task lines (one line of arguments per task)"),
        ("# only\n\n", "p.txt", "p.txt: no task lines (one line of arguments per task)"),
        ("ok\n[1, 2]\n", "--params", "--params:2: a JSON line must be a list of strings"),
        ('ok\n\n["a", 1]\n', "p.txt", "p.txt:3: a JSON line must be a list of strings"),
        ("'open\n", "p.txt", "p.txt:1: cannot split it into arguments: No closing quotation"),
        ("[oops\n", "p.txt", "p.txt:1: not a JSON list: "),
    ],
)
def test_params_refusals(text: str, source: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        params_task_args(text, source)
    if message.endswith(": "):
        assert str(info.value).startswith(message)
        assert len(str(info.value)) > len(message)
    else:
        assert str(info.value) == message


def test_params_source_defaults_to_the_option() -> None:
    with pytest.raises(UsageError, match=r"^--params:1: a JSON line"):
        params_task_args('{"a": 1}\n'.replace("{", "[").replace("}", "]").replace(":", ","))


def test_tasks_tuple_makes_nested_tuples() -> None:
    assert tasks_tuple([["a", "b"], []]) == (("a", "b"), ())
    assert type(tasks_tuple([["a"]])[0]) is tuple


# -- launcher, setup, program -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "launcher"),
    [
        (dict(), "none"),
        (dict(nodes=2), "torchrun"),
        (dict(tasks_per_node=2), "srun"),
        (dict(nodes=2, tasks_per_node=4), "srun"),
        (dict(gpus=0), "none"),
        (dict(gpus=0, nodes=2), "srun"),
        (dict(launcher="srun"), "srun"),
        (dict(launcher="none", nodes=3), "none"),
        (dict(launcher="torchrun", launcher_args=("--max-restarts=3",)), "torchrun"),
        (dict(launcher="srun", gpus=0, tasks_per_node=3), "srun"),
    ],
)
def test_the_launcher_chosen(kw: dict, launcher: str) -> None:
    assert choose_launcher(JobRequest("t.py", **kw)) == launcher


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (
            dict(gpus=0, launcher="torchrun"),
            "--launcher torchrun starts one worker per GPU, and this job has none (--gpus 0): "
            "use --launcher srun",
        ),
        (dict(launcher="mpirun"), "--launcher 'mpirun': expected one of torchrun, srun, none"),
        (
            dict(launcher="torchrun", tasks_per_node=2),
            "--tasks-per-node 2 with --launcher torchrun: torchrun starts one worker per GPU "
            "itself (--gpus); drop --tasks-per-node, or use --launcher srun",
        ),
        (
            dict(launcher="none", tasks_per_node=3),
            "--tasks-per-node 3 with --launcher none would start one process: use --launcher "
            "srun (one task each), or start them yourself and drop --tasks-per-node",
        ),
        (
            dict(launcher_args=("--x",)),
            "--launcher-arg needs a launcher: --launcher torchrun or srun",
        ),
        (
            dict(launcher="srun", launcher_args=("--ok", "a\x00")),
            "NUL character in --launcher-arg is not allowed: 'a\\x00'",
        ),
    ],
)
def test_launcher_refusals(kw: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        choose_launcher(JobRequest("t.py", **kw))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("kw", "pairs"),
    [
        (dict(), ()),
        (dict(setup=("source x", " ok ")), ()),
        (dict(modules=("cuda/12.1", "gcc")), ()),
        (
            dict(env=("HF_HOME=/data", "_X9=", "A=b=c")),
            (("HF_HOME", "/data"), ("_X9", ""), ("A", "b=c")),
        ),
    ],
)
def test_setup_modules_and_env_accepted(kw: dict, pairs: tuple) -> None:
    assert check_setup(JobRequest("t.py", **kw)) == pairs


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(setup=("a\nb",)), "--setup 'a\\nb': one line each (repeat --setup for more)"),
        (dict(setup=("a\rb",)), "--setup 'a\\rb': one line each (repeat --setup for more)"),
        (dict(setup=("ok", " \t")), "--setup must not be empty"),
        (dict(setup=("",)), "--setup must not be empty"),
        (dict(setup=("a\x00",)), "NUL character in --setup is not allowed: 'a\\x00'"),
        (dict(modules=("",)), "--module '': one module name (repeat --module for more)"),
        (dict(modules=("a b",)), "--module 'a b': one module name (repeat --module for more)"),
        (dict(modules=("a\tb",)), "--module 'a\\tb': one module name (repeat --module for more)"),
        (dict(modules=("a\x00",)), "NUL character in --module is not allowed: 'a\\x00'"),
        (dict(env=("x\x00=1",)), "NUL character in --env is not allowed: 'x\\x00=1'"),
        (
            dict(env=("HF_HOME",)),
            "--env 'HF_HOME': expected KEY=VALUE with KEY a variable name (e.g. HF_HOME=/data)",
        ),
        (
            dict(env=("9X=1",)),
            "--env '9X=1': expected KEY=VALUE with KEY a variable name (e.g. HF_HOME=/data)",
        ),
        (
            dict(env=("A-B=1",)),
            "--env 'A-B=1': expected KEY=VALUE with KEY a variable name (e.g. HF_HOME=/data)",
        ),
        (
            dict(env=("=1",)),
            "--env '=1': expected KEY=VALUE with KEY a variable name (e.g. HF_HOME=/data)",
        ),
    ],
)
def test_setup_refusals(kw: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        check_setup(JobRequest("t.py", **kw))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("kw", "answer"),
    [
        (dict(args=("--lr", "1")), (True, ("t.py", "--lr", "1"))),
        (dict(command=True, args=("-m", "pkg")), (False, ("t.py", "-m", "pkg"))),
    ],
)
def test_program_argv_of_a_script(kw: dict, answer: tuple) -> None:
    assert program_argv(JobRequest("t.py", **kw)) == answer


@pytest.mark.parametrize(
    ("script", "answer"),
    [
        ("python", (True, ("-m", "pkg"))),
        ("python3", (True, ("-m", "pkg"))),
        ("python3.11", (False, ("python3.11", "-m", "pkg"))),
        ("echo", (False, ("echo", "-m", "pkg"))),
    ],
)
def test_program_argv_of_a_command(script: str, answer: tuple) -> None:
    assert program_argv(JobRequest(script, args=("-m", "pkg"), command=True)) == answer


def test_resolve_carries_the_program_launcher_and_env() -> None:
    job = resolved(
        model="A100",
        gpus=2,
        nodes=2,
        tasks_per_node=2,
        launcher="srun",
        args=("--lr", "1"),
        env=("A=1",),
    )
    assert (job.runs_python, job.argv, job.launcher, job.env) == (
        True,
        ("train.py", "--lr", "1"),
        "srun",
        (("A", "1"),),
    )
    assert (job.nodes, job.gpus_per_node, job.tasks_per_node) == (2, 2, 2)
    assert job.site_name == "mllab"
    assert job.model is not None and job.model.name == "A100"
    assert job.interpreter is None


@pytest.mark.parametrize(
    ("script", "job_name", "name"),
    [
        ("dir/train.py", None, "train"),
        ("train", None, "train"),
        ("/", None, "clusterjob"),
        ("train.py", "mine", "mine"),
    ],
)
def test_the_job_name(script: str, job_name: str | None, name: str) -> None:
    assert resolved(script=script, model="A100", job_name=job_name).job_name == name


# -- containers and interpreters --------------------------------------------------------------


def interp(**kw: object):
    job = resolve(GRES_SITE, JobRequest("t.py", model="A100", **kw), environ={})  # type: ignore[arg-type]
    return job.interpreter, job.request


@pytest.mark.parametrize(
    ("kw", "python", "why"),
    [
        (dict(container_image="pt:24"), "python3", "python3 in the container image pt:24"),
        (dict(apptainer="/img/pt.sif"), "python3", "python3 in the container image /img/pt.sif"),
        (
            dict(container_image="pt", container_mounts="/data:/data", python="/opt/py"),
            "/opt/py",
            "--python, in the container image pt",
        ),
        (
            dict(apptainer="pt.sif", python="/opt/py", python_why="recorded at submit: x"),
            "/opt/py",
            "recorded at submit: x",
        ),
    ],
)
def test_the_interpreter_in_a_container(kw: dict, python: str, why: str) -> None:
    interpreter, request = interp(**kw)
    assert interpreter is not None
    assert (interpreter.python, interpreter.why) == (python, why)
    assert (request.python, request.python_why) == (python, why)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(container_image=""), "--container-image must not be empty"),
        (dict(apptainer=" "), "--apptainer must not be empty"),
        (dict(container_image="x", container_mounts=" "), "--container-mounts must not be empty"),
        (
            dict(container_image="a\x00"),
            "NUL character in --container-image is not allowed: 'a\\x00'",
        ),
        (dict(apptainer="a\x00"), "NUL character in --apptainer is not allowed: 'a\\x00'"),
        (
            dict(container_image="x", container_mounts="a\x00"),
            "NUL character in --container-mounts is not allowed: 'a\\x00'",
        ),
        (
            dict(container_image="a", apptainer="b"),
            "--container-image and --apptainer exclude each other: give one",
        ),
        (dict(container_mounts="/d:/d"), "--container-mounts needs --container-image (pyxis)"),
        (
            dict(apptainer="a.sif", container_mounts="/d:/d"),
            "--container-mounts needs --container-image (pyxis)",
        ),
        (
            dict(container_image="x", venv="/v"),
            "--venv names an environment on the host; in a container give --python PATH "
            "(a path inside the image) or nothing (python3 in the image)",
        ),
        (
            dict(apptainer="x.sif", conda="base"),
            "--conda names an environment on the host; in a container give --python PATH "
            "(a path inside the image) or nothing (python3 in the image)",
        ),
    ],
)
def test_container_refusals(kw: dict, message: str) -> None:
    with pytest.raises(UsageError) as info:
        interp(**kw)
    assert str(info.value) == message


def test_a_recorded_interpreter_is_reused_with_its_reason() -> None:
    python = sys.executable
    interpreter, request = interp(python=python, python_why="--python", venv="/v")
    assert interpreter is not None
    assert (interpreter.python, interpreter.why, interpreter.venv, interpreter.bin_dir) == (
        os.path.abspath(python),
        "recorded at submit: --python",
        "/v",
        str(Path(os.path.abspath(python)).parent),
    )
    assert request.python_why == "recorded at submit: --python"
    again, _ = interp(python=python, python_why="recorded at submit: --python")
    assert again is not None and again.why == "recorded at submit: --python"


def test_a_recorded_interpreter_must_still_be_there(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        interp(python=str(tmp_path / "gone"), python_why="--python")
    assert str(info.value) == f"the recorded interpreter {tmp_path / 'gone'}: no such file"


def test_a_recorded_conda_env_is_reused(tmp_path: Path) -> None:
    conda = tmp_path / "conda"
    conda.write_text("#!/bin/sh\n")
    conda.chmod(0o755)
    job = resolve(
        GRES_SITE,
        JobRequest("t.py", model="A100", conda="torch", python_why="--conda torch"),
        environ={"CONDA_EXE": str(conda), "PATH": ""},
    )
    interpreter = job.interpreter
    assert interpreter is not None
    assert (interpreter.python, interpreter.why, interpreter.conda, interpreter.conda_exe) == (
        None,
        "recorded at submit: --conda torch",
        "torch",
        str(conda),
    )
    assert (job.request.conda, job.request.python) == ("torch", None)


def test_the_interpreter_chosen_at_submit_is_recorded() -> None:
    python = os.path.abspath(sys.executable)
    job = resolve(
        GRES_SITE,
        JobRequest("t.py", model="A100", submit_python=python, active_env="/env"),
        environ={},
    )
    assert job.interpreter is not None
    assert job.interpreter.python == python
    assert job.request.python == python
    assert job.request.python_why == job.interpreter.why


def test_without_a_path_nothing_chooses_an_interpreter() -> None:
    interpreter, request = interp()
    assert interpreter is None
    assert (request.python, request.python_why) == (None, None)


@pytest.mark.parametrize(("gpus", "nodes"), [(4, 1), (2, 2), (1, 4)])
def test_a_models_cap_per_job_allows_up_to_it(gpus: int, nodes: int) -> None:
    site = make_site(models=(replace(A100, max_per_job=4), V100))
    assert resolved(site, model="A100", gpus=gpus, nodes=nodes).gpus_per_node == gpus


@pytest.mark.parametrize(("gpus", "nodes", "total"), [(1, 5, 5), (3, 2, 6)])
def test_a_models_cap_per_job_refuses_more(gpus: int, nodes: int, total: int) -> None:
    site = make_site(models=(replace(A100, max_per_job=4), V100))
    assert refusal(site, model="A100", gpus=gpus, nodes=nodes) == (
        f"a job may have at most 4 A100 at this site, asked for {total}: ask for fewer, or for "
        "whole GPUs"
    )


# -- what the interpreter is chosen from -----------------------------------------------------

PY = os.path.abspath(sys.executable)


def test_a_reason_recorded_without_an_interpreter_is_not_a_recorded_choice() -> None:
    interpreter, request = interp(python_why="recorded at submit: --python")
    assert interpreter is None
    assert request.python is None


@pytest.mark.parametrize(
    ("kw", "python", "why"),
    [
        (dict(python=PY), PY, "--python"),
        (
            dict(submit_python=PY, active_env="/env"),
            PY,
            "python3 on the submitting PATH, env /env active",
        ),
        (dict(submit_python=PY), PY, "python3 on the submitting PATH"),
    ],
)
def test_the_interpreter_from_the_options_and_the_submitting_shell(
    kw: dict, python: str, why: str
) -> None:
    interpreter, request = interp(**kw)
    assert interpreter is not None
    assert (interpreter.python, interpreter.why) == (python, why)
    assert (request.python, request.python_why) == (python, why)


def test_the_active_env_alone_gives_no_interpreter_without_a_python() -> None:
    interpreter, _ = interp(active_env="/env")
    assert interpreter is None


def test_a_venv_given_is_the_interpreters_directory(tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(PY)
    interpreter, request = interp(venv=str(tmp_path))
    assert interpreter is not None
    assert (interpreter.python, interpreter.venv, interpreter.why) == (
        str(tmp_path / "bin" / "python"),
        str(tmp_path),
        "--venv",
    )
    assert request.venv == str(tmp_path)


def test_a_conda_env_given_is_found_through_the_environment(tmp_path: Path) -> None:
    conda = tmp_path / "conda"
    conda.write_text("#!/bin/sh\n")
    conda.chmod(0o755)
    job = resolve(
        GRES_SITE,
        JobRequest("t.py", model="A100", conda="torch"),
        environ={"CONDA_EXE": str(conda), "PATH": ""},
    )
    assert job.interpreter is not None
    assert (job.interpreter.conda, job.interpreter.conda_exe, job.interpreter.why) == (
        "torch",
        str(conda),
        "--conda",
    )


@pytest.mark.parametrize(
    ("where", "why"),
    [("partition", "mllab.yaml: partitions.gpu.job python"), ("site", "mllab.yaml: job python")],
)
def test_the_sites_and_partitions_interpreter(where: str, why: str) -> None:
    from clusterjob.site.model import JobEnvironment

    entry = JobEnvironment(python=PY)
    if where == "site":
        site = replace(GRES_SITE, job=entry)
    else:
        partitions = tuple(
            replace(p, job=entry) if p.name == "gpu" else p for p in GRES_SITE.partitions
        )
        site = replace(GRES_SITE, partitions=partitions)
    job = resolve(site, JobRequest("t.py", model="A100"), environ={})
    assert job.interpreter is not None
    assert (job.interpreter.python, job.interpreter.why) == (PY, why)


# -- smaller edges ---------------------------------------------------------------------------


def test_two_tasks_without_a_launcher_are_refused() -> None:
    with pytest.raises(UsageError) as info:
        choose_launcher(JobRequest("t.py", launcher="none", tasks_per_node=2))
    assert str(info.value).startswith("--tasks-per-node 2 with --launcher none would start one")


def test_a_node_with_one_gpu_of_the_model_has_it() -> None:
    nodes = dict(GRES_SITE.node_map.nodes)
    nodes["mix01"] = nodes["mix01"][:2]  # A100, V100
    site = replace(GRES_SITE, node_map=replace(GRES_SITE.node_map, nodes=nodes))
    job = resolved(site, model="V100", partition="mixed")
    assert (job.partition.name, job.eligible_nodes) == ("mixed", ("mix01",))


def test_the_gres_type_is_kept_when_the_model_has_a_feature_too() -> None:
    site = make_site("gres+constraint", models=(replace(A100, constraint="a100"), V100))
    job = resolved(site, model="A100", gpus=2)
    assert job.gres.gres_type == "a100"
    assert job.gres.options == ("--gres=gpu:a100:2", "--constraint=a100")


def test_a_partition_without_the_model_lists_all_it_has() -> None:
    site = make_site(models=(A100, V100, H100))
    assert refusal(site, model="H100", partition="mixed") == (
        "partition mixed at site mllab has no H100 nodes (it has: A100, V100)"
    )


def test_a_cpu_only_jobs_exclude_must_be_a_hostlist() -> None:
    assert refusal(gpus=0, partition="cpu", exclude="cpu[01").startswith(
        "--exclude: not a Slurm hostlist: 'cpu[01' ("
    )


def test_a_constraint_with_capital_letters_is_joined() -> None:
    job = resolved(CONSTRAINT_SITE, model="A100", constraint="XL")
    assert job.gres.options == ("--gres=gpu:1", "--constraint=a100&XL")


# -- the QoS as the queue, accounts, the job name --------------------------------------------

QOS_QUEUE_SITE = replace(
    GRES_SITE,
    partitions=tuple(
        replace(p, submit_as="qos") if p.name == "debug" else p for p in GRES_SITE.partitions
    ),
)


@pytest.mark.parametrize(
    ("kw", "partition", "qos"),
    [
        (dict(qos="debug"), "debug", "debug"),  # --qos names the queue: it picks the partition
        (dict(partition="debug"), "debug", "debug"),
        (dict(qos="gpu"), "gpu", "gpu"),  # a plain partition: the QoS is only the QoS
        (dict(), "gpu", "normal"),
    ],
)
def test_where_the_qos_is_the_queue(kw: dict, partition: str, qos: str) -> None:
    job = resolved(QOS_QUEUE_SITE, model="V100", **kw)
    assert (job.partition.name, job.qos) == (partition, qos)


def test_a_qos_that_contradicts_the_queue() -> None:
    assert refusal(QOS_QUEUE_SITE, model="V100", partition="debug", qos="other") == (
        "at site mllab the QoS is the queue: --qos other and partition debug contradict each "
        "other (give one)"
    )


def test_account_and_project_exclude_each_other() -> None:
    assert refusal(model="A100", account="x", project="p") == (
        "--account and --project exclude each other: --account is used as given"
    )


def test_a_script_name_that_cannot_be_a_job_name() -> None:
    assert refusal(script="a\nb.py", model="A100") == (
        "line break in the job name is not allowed: 'a\\nb' (an #SBATCH directive must fit on "
        "one line)"
    )
