"""The five example sites written from real clusters' public documentation render the example
jobs found for them line for line.

Each case is the documentation's own ``#SBATCH`` block (its comments dropped) and the
``clusterjob submit`` options a user would give for that job; the test renders the job with
the shipped site file and compares the directives. Each case's source names the page and the
copy of it the block was read from. A page that could not be found in any stored copy has no
case (the site file names it and says which of its lines are unverified); one Jean Zay case is
from a users' community guide, not the centre's own pages, and says so.
The comparison reads both sides the way sbatch does and nothing more:

* short options are their long names (``-C gpu`` is ``--constraint=gpu``), quotes around a
  value are read away, memory units are one case (``40gb`` is ``40G``);
* spellings that mean the same allocation are the same: ``--ntasks=N`` on M nodes and
  ``--ntasks-per-node=N/M``; ``--ntasks=N --ntasks-per-node=K`` without ``--nodes`` and
  ``--nodes=N/K`` (sbatch derives the node count); ``--gpus=T:N`` on one node and
  ``--gpus-per-node=T:N``; ``--ntasks-per-node=1`` and no task count (Slurm's default);
* clusterjob's own lines are allowed beyond the documented ones: ``--comment=clusterjob:TOKEN``
  (how a job is found again), ``--job-name`` (always written), and per case the lines the
  documentation leaves to a site default that this site file writes out, each named below.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest

from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.resources import site_configs_dir
from clusterjob.site.loader import load_site, validate_site_file

TOKEN = "0123456789abcdef"
PERLMUTTER_PAGE = "https://docs.nersc.gov/systems/perlmutter/running-jobs/"

SHORT = {
    "-A": "--account",
    "-C": "--constraint",
    "-q": "--qos",
    "-t": "--time",
    "-N": "--nodes",
    "-n": "--ntasks",
    "-c": "--cpus-per-task",
    "-J": "--job-name",
    "-o": "--output",
    "-e": "--error",
    "-p": "--partition",
    "-G": "--gpus",
}


@dataclass(frozen=True)
class Example:
    site: str
    source: str  # the page the block is from
    documented: str  # its #SBATCH lines
    request: dict[str, object]
    # lines the site file writes narrower than the page, each with why: option -> value
    narrowed: tuple[tuple[str, str], ...] = ()


# Perlmutter's page asks -C gpu, which its 80 GB nodes also have (users' scripts: "-C gpu can
# give 40 GB or 80 GB A100 nodes"); the site file pins the 40 GB model with gpu&hbm40g.
PERLMUTTER_40GB = (("--constraint", "gpu&hbm40g"),)


def _option(line: str) -> tuple[str, str | None]:
    body = line.split("#", 2)[1].removeprefix("SBATCH").strip()
    body = re.split(r"\s+#", body, maxsplit=1)[0].strip()  # a trailing comment
    if body.startswith("--"):
        name, sep, value = body.partition("=")
        if not sep and " " in name:
            name, _, value = name.partition(" ")
            sep = " "
    else:
        name, value = body[:2], body[2:].strip()
        sep = "=" if value else ""
    name = SHORT.get(name, name)
    if not sep:
        return name, None
    value = value.strip().strip('"').strip("'")
    if name in ("--mem", "--mem-per-gpu"):
        value = re.sub(r"(?i)^([0-9]+)([kmgt])b?$", lambda m: m[1] + m[2].upper(), value)
    return name, value


def _normalised(lines: list[str]) -> dict[str, str | None]:
    options = dict(_option(line) for line in lines)
    nodes = int(options.get("--nodes") or 1)
    ntasks = options.pop("--ntasks", None)
    per_node = options.get("--ntasks-per-node")
    if ntasks is not None and per_node is None:
        options["--ntasks-per-node"] = str(int(ntasks) // nodes)
    elif ntasks is not None and per_node is not None:
        if "--nodes" not in options and int(ntasks) % int(per_node) == 0:
            nodes = int(ntasks) // int(per_node)  # sbatch derives -N from -n and the per-node count
            options["--nodes"] = str(nodes)
        elif int(ntasks) != int(per_node) * nodes:
            options["--ntasks"] = ntasks  # an inconsistent pair stays a difference
    gpus = options.get("--gpus")
    if gpus is not None and nodes == 1 and "--gpus-per-node" not in options:
        options["--gpus-per-node"] = options.pop("--gpus")
    if options.get("--ntasks-per-node") == "1":
        del options["--ntasks-per-node"]
    options.setdefault("--nodes", "1")
    return options


def _sbatch_lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#SBATCH")]


EXAMPLES = {
    # Perlmutter: "More GPU affinity examples" on NERSC's GPU running-jobs page, read from a
    # stored copy of its Markdown source (an early version, 2021; the copy names no commit).
    "perlmutter-1node-1task-1gpu": Example(
        "perlmutter",
        PERLMUTTER_PAGE + " (1 node, 1 task, 1 GPU)",
        """
        #SBATCH -A <account>
        #SBATCH -C gpu
        #SBATCH -q regular
        #SBATCH -t 1:00:00
        #SBATCH -n 1
        #SBATCH --ntasks-per-node=1
        #SBATCH -c 128
        #SBATCH --gpus-per-task=1
        """,
        dict(gpus=1, model="a100", account="<account>", time="1:00:00", cpus_per_gpu=128),
        PERLMUTTER_40GB,
    ),
    "perlmutter-1node-4gpus-all-visible": Example(
        "perlmutter",
        PERLMUTTER_PAGE + " (1 node, 4 tasks, 4 GPUs, all GPUs visible to all tasks)",
        """
        #SBATCH -A <account>
        #SBATCH -C gpu
        #SBATCH -q regular
        #SBATCH -t 1:00:00
        #SBATCH -n 4
        #SBATCH --ntasks-per-node=4
        #SBATCH -c 32
        #SBATCH --gpus-per-task=1
        """,
        dict(gpus=4, model="a100", account="<account>", time="1:00:00"),
        PERLMUTTER_40GB,
    ),
    "perlmutter-4nodes-1gpu-per-task": Example(
        "perlmutter",
        PERLMUTTER_PAGE + " (4 nodes, 16 tasks, 16 GPUs, 1 GPU visible to each task)",
        """
        #SBATCH -A <account>
        #SBATCH -C gpu
        #SBATCH -q regular
        #SBATCH -t 1:00:00
        #SBATCH -n 16
        #SBATCH --ntasks-per-node=4
        #SBATCH -c 32
        #SBATCH --gpus-per-task=1
        #SBATCH --gpu-bind=map_gpu:0,1,2,3
        """,
        dict(
            gpus=4,
            nodes=4,
            model="a100",
            account="<account>",
            time="1:00:00",
            sbatch_args=("--gpu-bind=map_gpu:0,1,2,3",),
        ),
        PERLMUTTER_40GB,
    ),
    "narval-one-gpu": Example(
        "narval",
        "https://docs.alliancecan.ca/wiki/Using_GPUs_with_Slurm (multi-threaded job), read "
        "from the copy of its wiki text at https://github.com/ualberta-rcg/alliance-wiki-rag-data"
        "/blob/269ae9c971727cbbe4a694854e769ac435f05a9f/wiki_pages/Using%20GPUs%20with%20Slurm_en.txt",
        """
        #SBATCH --account=def-someuser
        #SBATCH --gpus-per-node=a100:1
        #SBATCH --cpus-per-task=6
        #SBATCH --mem=4000M
        #SBATCH --time=0-03:00
        """,
        dict(
            gpus=1,
            model="a100",
            account="def-someuser",
            cpus_per_gpu=6,
            mem_per_gpu="4000M",
            time="0-03:00",
        ),
    ),
    "narval-mig": Example(
        "narval",
        "https://docs.alliancecan.ca/wiki/Multi-Instance_GPU (the 24-hour batch job on one "
        "4g.20gb instance), read from the copy of its wiki text at "
        "https://github.com/ualberta-rcg/alliance-wiki-rag-data/blob/"
        "269ae9c971727cbbe4a694854e769ac435f05a9f/wiki_pages/Multi-Instance%20GPU_en.txt",
        """
        #SBATCH --account=def-someuser
        #SBATCH --gpus=a100_4g.20gb:1
        #SBATCH --cpus-per-task=6
        #SBATCH --mem=62gb
        #SBATCH --time=24:00:00
        """,
        dict(
            gpus=1,
            model="a100_4g.20gb",
            account="def-someuser",
            cpus_per_gpu=6,
            mem_per_gpu="62G",
            time="24:00:00",
        ),
    ),
    # Jean Zay: IDRIS's own one-GPU and multi-GPU pages were not found in any stored copy;
    # these are the GPU job scripts that were. A job of up to 20 hours gets the default QoS
    # (qos_by_time's null): no --qos line, as in IDRIS's scripts.
    "jeanzay-cuda-mps": Example(
        "jeanzay",
        "http://www.idris.fr/eng/jean-zay/gpu/jean-zay-gpu-exec_utilisation_cuda_mps-eng.html "
        "(the default gpu partition, one node), read from a stored copy of the page",
        """
        #SBATCH --job-name=gpu_cuda_mps_multi_mpi
        #SBATCH --ntasks=40
        #SBATCH --ntasks-per-node=40
        #SBATCH --gres=gpu:4
        #SBATCH --cpus-per-task=1
        #SBATCH --hint=nomultithread
        #SBATCH --time=00:10:00
        #SBATCH --output=gpu_cuda_mps_multi_mpi%j.out
        #SBATCH --error=gpu_cuda_mps_multi_mpi%j.out
        #SBATCH --exclusive
        #SBATCH -C mps
        """,
        dict(
            gpus=4,
            model="v100",
            tasks_per_node=40,
            job_name="gpu_cuda_mps_multi_mpi",
            time="00:10:00",
            output="gpu_cuda_mps_multi_mpi%j.out",
            error="gpu_cuda_mps_multi_mpi%j.out",
            constraint="mps",
            sbatch_args=("--exclusive",),
        ),
    ),
    "jeanzay-one-gpu-community": Example(
        "jeanzay",
        "https://github.com/jean-zay-users/jean-zay-doc/blob/"
        "a9b8866c3f9dc57f9b187d9e721afa4a306bbf36/docs/examples/tf/tf_simple/"
        "mnist_submission_script.slurm (a users' community guide, not IDRIS's own page)",
        """
        #SBATCH --job-name=tf_mnist
        #SBATCH --ntasks=1
        #SBATCH --ntasks-per-node=1
        #SBATCH --gres=gpu:1
        #SBATCH --cpus-per-task=10
        #SBATCH --hint=nomultithread
        #SBATCH --distribution=block:block
        #SBATCH --time=2:00:00
        #SBATCH --output=tf_mnist%j.out
        #SBATCH --error=tf_mnist%j.out
        #SBATCH --qos=qos_gpu-dev
        """,
        dict(
            gpus=1,
            model="v100",
            job_name="tf_mnist",
            time="2:00:00",
            output="tf_mnist%j.out",
            error="tf_mnist%j.out",
            qos="qos_gpu-dev",
            sbatch_args=("--distribution=block:block",),
        ),
    ),
    # Jean Zay, H100 (gpu_p6, picked by -C h100): job scripts from IDRIS's own public
    # repositories (github.com/idriscnrs). An H100 job of up to 20 hours names no QoS there.
    "jeanzay-h100-one-gpu-idris": Example(
        "jeanzay",
        "https://github.com/idriscnrs/picotron_tutorial_jean-zay/blob/"
        "b3729cabb8f3a046201553754d3f01d92cefe47c/slurm/run_step1.slurm (IDRIS's Picotron "
        "tutorial for Jean Zay's H100 partition; its account line is commented out)",
        """
        #SBATCH --job-name=step1
        #SBATCH --nodes=1
        #SBATCH --ntasks-per-node=1
        #SBATCH --gres=gpu:1
        #SBATCH --cpus-per-task=24
        #SBATCH --hint=nomultithread
        #SBATCH --constraint=h100
        #SBATCH --qos=qos_gpu_h100-dev
        #SBATCH --time=00:10:00
        #SBATCH --output=step1_modeling_%j.out
        #SBATCH --error=step1_modeling_%j.out
        """,
        dict(
            gpus=1,
            model="h100",
            job_name="step1",
            qos="qos_gpu_h100-dev",
            time="00:10:00",
            output="step1_modeling_%j.out",
            error="step1_modeling_%j.out",
        ),
    ),
    "jeanzay-h100-2nodes-idris": Example(
        "jeanzay",
        "https://github.com/idriscnrs/picotron_tutorial_jean-zay/blob/"
        "b3729cabb8f3a046201553754d3f01d92cefe47c/slurm/run_step9.slurm (IDRIS's Picotron "
        "tutorial, 3D parallelism on two H100 nodes)",
        """
        #SBATCH --job-name=step9
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=4
        #SBATCH --gres=gpu:4
        #SBATCH --cpus-per-task=24
        #SBATCH --hint=nomultithread
        #SBATCH --constraint=h100
        #SBATCH --qos=qos_gpu_h100-dev
        #SBATCH --time=00:10:00
        #SBATCH --output=step9_3D_parallelism_%j.out
        #SBATCH --error=step9_3D_parallelism_%j.out
        """,
        dict(
            gpus=4,
            nodes=2,
            model="h100",
            job_name="step9",
            qos="qos_gpu_h100-dev",
            time="00:10:00",
            output="step9_3D_parallelism_%j.out",
            error="step9_3D_parallelism_%j.out",
        ),
    ),
    "jeanzay-a100-16-nodes-idris": Example(
        "jeanzay",
        "https://github.com/idriscnrs/Democratizing-LLM-FT/blob/"
        "0842a846d9ea697e8e077a32a73c1c88cc846e14/slurm/FSDP_sAC_a100_14B_.slurm (IDRIS's "
        "FSDP fine-tuning on 16 A100 nodes: -C a100 with the partition named, a "
        "{project}@a100 account, no QoS for 2 hours)",
        """
        #SBATCH --job-name=bc
        #SBATCH --output=logs/out/FSDP_sAC_a100_14B_%j.out
        #SBATCH --error=logs/err/FSDP_sAC_a100_14B_%j.err
        #SBATCH --gres=gpu:8
        #SBATCH --nodes=16
        #SBATCH --ntasks-per-node=8
        #SBATCH --hint=nomultithread
        #SBATCH --time=02:00:00
        #SBATCH --cpus-per-task=8
        #SBATCH -C a100
        #SBATCH --partition=gpu_p5
        #SBATCH --account=sos@a100
        """,
        dict(
            gpus=8,
            nodes=16,
            model="a100",
            project="sos",
            job_name="bc",
            time="02:00:00",
            output="logs/out/FSDP_sAC_a100_14B_%j.out",
            error="logs/err/FSDP_sAC_a100_14B_%j.err",
        ),
    ),
    "jeanzay-h100-account-idris": Example(
        "jeanzay",
        "https://github.com/idriscnrs/JZ-Megatron-DeepSpeed/blob/"
        "15c93c4bdf5281a7078b1f00d01c57e39d89bbd1/examples_JZ/finetune_hf_llama/"
        "megadeep_llama2_7b.slurm (IDRIS's Megatron-DeepSpeed examples for Jean Zay: an "
        "{project}@h100 account, no QoS for 10.5 hours)",
        """
        #SBATCH --job-name=megadeep
        #SBATCH --output=./h100.out
        #SBATCH --error=./h100.out
        #SBATCH -A sos@h100
        #SBATCH -C h100
        #SBATCH --time=10:30:00
        #SBATCH --nodes=1
        #SBATCH --ntasks-per-node=4
        #SBATCH --cpus-per-task=24
        #SBATCH --gres=gpu:4
        #SBATCH --hint=nomultithread
        #SBATCH --exclusive
        """,
        dict(
            gpus=4,
            model="h100",
            project="sos",
            job_name="megadeep",
            time="10:30:00",
            output="./h100.out",
            error="./h100.out",
            sbatch_args=("--exclusive",),
        ),
    ),
    "lumi-standard-g": Example(
        "lumi",
        "https://docs.lumi-supercomputer.eu/runjobs/scheduled-jobs/lumig-job/ (MPI-based job), "
        "read from its source at https://github.com/Lumi-supercomputer/lumi-userguide/blob/"
        "6c3a26c0fc8f2174e1dde45adb75def88d8010a4/docs/runjobs/scheduled-jobs/lumig-job.md",
        """
        #SBATCH --job-name=examplejob
        #SBATCH --output=examplejob.o%j
        #SBATCH --error=examplejob.e%j
        #SBATCH --partition=standard-g
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=8
        #SBATCH --gpus-per-node=8
        #SBATCH --time=1-12:00:00
        #SBATCH --account=project_<id>
        """,
        dict(
            gpus=8,
            nodes=2,
            partition="standard-g",
            project="<id>",
            job_name="examplejob",
            output="examplejob.o%j",
            error="examplejob.e%j",
            time="1-12:00:00",
        ),
    ),
    # Lonestar6: the user guide's own job-script samples are all CPU jobs; TACC's software pages
    # have the GPU ones, each named as a Lonestar6 script.
    "lonestar6-gpu-a100-gromacs": Example(
        "lonestar6",
        "https://docs.tacc.utexas.edu/software/gromacs/#scripts-lonestar6-gpu (two A100 nodes, "
        "three MPI tasks each), read from its source at https://github.com/TACC/TACC-Docs/blob/"
        "1d94ecfa3d5c9a49b301e41630a3cc69636cfee9/docs/software/gromacs.md",
        """
        #SBATCH -J myjob
        #SBATCH -e myjob.%j.err
        #SBATCH -o myjob.%j.out
        #SBATCH -N 2
        #SBATCH -n 6
        #SBATCH -p gpu-a100
        #SBATCH -t 24:00:00
        #SBATCH -A myproject
        """,
        dict(
            gpus=3,
            nodes=2,
            model="a100",
            partition="gpu-a100",
            account="myproject",
            job_name="myjob",
            output="myjob.%j.out",
            error="myjob.%j.err",
            time="24:00:00",
        ),
    ),
    "lonestar6-gpu-a100-small-alphafold3": Example(
        "lonestar6",
        "https://docs.tacc.utexas.edu/software/alphafold3/ (SLURM Job Script Preparation, the "
        "Lonestar6 script), read from its source at https://github.com/TACC/TACC-Docs/blob/"
        "1d94ecfa3d5c9a49b301e41630a3cc69636cfee9/docs/software/alphafold3.md",
        """
        #SBATCH -J AF3_protein
        #SBATCH -o AF3_protein.o%j
        #SBATCH -e AF3_protein.e%j
        #SBATCH -p gpu-a100-small
        #SBATCH -N 1
        #SBATCH -t 01:00:00
        #SBATCH -A my-project
        """,
        dict(
            gpus=1,
            model="a100",
            partition="gpu-a100-small",
            account="my-project",
            job_name="AF3_protein",
            output="AF3_protein.o%j",
            error="AF3_protein.e%j",
            time="01:00:00",
        ),
    ),
    "lonestar6-gpu-a100-namd-one-task-per-node": Example(
        "lonestar6",
        "https://docs.tacc.utexas.edu/software/namd/#lonestar6 (GPU nodes, one task per node "
        "for a node's three GPUs), read from its source at https://github.com/TACC/TACC-Docs/"
        "blob/1d94ecfa3d5c9a49b301e41630a3cc69636cfee9/docs/software/namd.md",
        """
        #SBATCH -J test
        #SBATCH -o test.o%j
        #SBATCH -N 3
        #SBATCH -n 3
        #SBATCH -p gpu-a100
        #SBATCH -t 24:00:00
        """,
        dict(
            gpus=3,
            nodes=3,
            tasks_per_node=1,
            launcher="srun",
            model="a100",
            partition="gpu-a100",
            job_name="test",
            output="test.o%j",
            time="24:00:00",
        ),
    ),
    "lonestar6-gpu-a100-namd-gpu-resident": Example(
        "lonestar6",
        "https://docs.tacc.utexas.edu/software/namd/#lonestar6 (GPU-resident mode: one node, "
        "one MPI task), read from its source at https://github.com/TACC/TACC-Docs/blob/"
        "1d94ecfa3d5c9a49b301e41630a3cc69636cfee9/docs/software/namd.md",
        """
        #SBATCH -J test
        #SBATCH -o test.o%j
        #SBATCH -N 1
        #SBATCH -n 1
        #SBATCH -p gpu-a100
        #SBATCH -t 24:00:00
        """,
        dict(
            gpus=3,
            tasks_per_node=1,
            model="a100",
            partition="gpu-a100",
            job_name="test",
            output="test.o%j",
            time="24:00:00",
        ),
    ),
}

SITES = ("perlmutter", "narval", "jeanzay", "lumi", "lonestar6")


def _rendered(example: Example) -> list[str]:
    site = load_site(site_configs_dir() / f"{example.site}.yaml")
    request = JobRequest("train.py", token=TOKEN, **example.request)  # type: ignore[arg-type]
    job = resolve(site, request, choose_interpreter=False)
    return _sbatch_lines(render(site, job, python="/usr/bin/python3").script)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_documented_example_renders_line_for_line(name: str) -> None:
    example = EXAMPLES[name]
    documented = _normalised(_sbatch_lines(example.documented))
    for option, value in example.narrowed:  # the page's line, as the site file pins it
        assert option in documented, (name, option)
        documented[option] = value
    rendered = _normalised(_rendered(example))
    allowed = {"--comment": f"clusterjob:{TOKEN}", **{"--job-name": rendered.get("--job-name")}}
    missing = {k: v for k, v in documented.items() if rendered.get(k, "<absent>") != v}
    extra = {
        k: v for k, v in rendered.items() if k not in documented and allowed.get(k, "<x>") != v
    }
    assert not missing, f"{name}: documented lines not rendered as documented: {missing}"
    assert not extra, f"{name}: lines the documentation does not have: {extra}"


@pytest.mark.parametrize("name", SITES)
def test_each_example_site_validates_and_names_its_sources(name: str) -> None:
    path = site_configs_dir() / f"{name}.yaml"
    site, issues = validate_site_file(path)
    assert site is not None and [str(i) for i in issues] == []
    head = path.read_text().split("\nsite:", 1)[0]
    assert "https://" in head or "http://" in head, "the file names the pages it follows"
    assert "GUESSES" in head, "the file says what no document gives"


def test_every_example_site_has_a_documented_example() -> None:
    assert {e.site for e in EXAMPLES.values()} == set(SITES)
