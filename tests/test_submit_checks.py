"""A request that names something that does not exist says so, before anything reaches sbatch:
a dependency on a job Slurm does not know (Slurm would drop it and start the job at once), a
node the site does not have (not "cannot give 1 A100 GPUs"), a mistyped model, partition or
launcher (with the name that was meant). On the real cluster: tests/e2e/test_submit_checks.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob import resources
from clusterjob.errors import UsageError, did_you_mean
from clusterjob.jobs.registry import Registry
from clusterjob.jobs.submit import (
    Submitted,
    TestOnlyResult,
    check_dependency,
    dependency_job_ids,
    submit,
)
from clusterjob.jobscript.render import render
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site

TRAIN = str(Path(__file__).resolve().parents[1] / "examples" / "train.py")


@pytest.fixture
def mllab() -> Site:
    return load_site(resources.site_configs_dir() / "mllab.yaml")


# --- --dependency -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("dependency", "ids"),
    [
        ("afterok:12", ["12"]),
        ("afterok:12:13,afterany:14", ["12", "13", "14"]),
        ("after:12+30?afternotok:13", ["12", "13"]),
        ("aftercorr:12_3", ["12_3"]),
        ("12", ["12"]),  # a bare id: Slurm's afterany
        ("singleton", []),
        ("afterok:12,singleton", ["12"]),
        ("afterok:oops", []),  # not a job id: sbatch's to refuse
    ],
)
def test_the_job_ids_a_dependency_names(dependency: str, ids: list[str]) -> None:
    assert dependency_job_ids(dependency) == ids


def test_a_dependency_on_a_job_slurm_does_not_know_is_refused_before_sbatch(
    tmp_path: Path, mllab: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = FakeSlurm()
    running = slurm.add_job(state="RUNNING", reason="None")
    for test_only in (False, True):
        resolved = resolve(
            mllab, JobRequest(script=TRAIN, model="a100", dependency=f"afterok:{running}:99999")
        )
        with pytest.raises(UsageError) as info:
            submit(mllab, resolved, render(mllab, resolved), client=slurm.client(),
                   workdir="/w", test_only=test_only)  # fmt: skip
        assert str(info.value) == (
            f"--dependency afterok:{running}:99999: Slurm knows no job 99999 (neither queued "
            "nor in accounting); Slurm would drop the dependency and start this job at once"
        )
    assert slurm.commands("sbatch") == []
    assert Registry(tmp_path / "data" / "jobs.sqlite").all() == []


@pytest.mark.parametrize("where", ["queued", "accounting only", "array task"])
def test_a_dependency_on_a_job_slurm_knows_is_submitted(
    tmp_path: Path, mllab: Site, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """A job the controller holds, or one it forgot long ago that accounting still has."""
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    slurm = FakeSlurm()
    if where == "array task":
        slurm.add_array({1: ("COMPLETED", "0:0"), 2: ("RUNNING", "0:0")})
        dependency = "aftercorr:100_1"
    else:
        job = slurm.add_job(state="COMPLETED", reason="None")
        if where == "accounting only":
            slurm.forgotten.add(job)
        dependency = f"afterok:{job}"
    resolved = resolve(mllab, JobRequest(script=TRAIN, model="a100", dependency=dependency))
    result = submit(mllab, resolved, render(mllab, resolved), client=slurm.client(), workdir="/w")
    assert isinstance(result, Submitted) and result.job_id == "101"
    test = submit(mllab, resolved, render(mllab, resolved), client=slurm.client(),
                  workdir="/w", test_only=True)  # fmt: skip
    assert isinstance(test, TestOnlyResult)


def test_without_accounting_a_job_the_controller_forgot_is_unknown() -> None:
    slurm = FakeSlurm(accounting=False)
    job = slurm.add_job(state="COMPLETED", reason="None")
    check_dependency(f"afterok:{job}", slurm.client())
    slurm.forgotten.add(job)
    with pytest.raises(UsageError, match=f"Slurm knows no job {job} "):
        check_dependency(f"afterok:{job}", slurm.client())


def test_one_squeue_and_at_most_one_sacct_call_whatever_the_number_of_jobs() -> None:
    slurm = FakeSlurm()
    jobs = [slurm.add_job() for _ in range(5)]
    check_dependency("afterok:" + ":".join(jobs), slurm.client())
    assert [c[0] for c in slurm.calls] == ["squeue"]
    slurm.calls.clear()
    slurm.forgotten.update(jobs[:2])
    check_dependency("afterany:" + ":".join(jobs), slurm.client())
    assert [c[0] for c in slurm.calls] == ["squeue", "sacct"]


# --- --nodelist / --exclude -------------------------------------------------------------------


@pytest.mark.parametrize("gpus", [1, 0])  # a GPU job and a CPU-only one: the same answer
@pytest.mark.parametrize("option", ["nodelist", "exclude"])
def test_a_node_the_site_does_not_have_is_named_unknown(
    mllab: Site, gpus: int, option: str
) -> None:
    with pytest.raises(UsageError) as info:
        resolve(
            mllab, JobRequest(script=TRAIN, model="a100" if gpus else None, gpus=gpus,
                              **{option: "ml-gpu[01,09]"})  # type: ignore[arg-type]
        )  # fmt: skip
    assert str(info.value) == (
        f"--{option}: no node ml-gpu09 at site mllab; its nodes: ml-gpu[01-08]"
    )


def test_a_mistyped_node_is_named_with_the_one_meant(mllab: Site) -> None:
    with pytest.raises(UsageError, match=r"^--nodelist: no node mlgpu-01 at site mllab "):
        resolve(mllab, JobRequest(script=TRAIN, model="a100", nodelist="mlgpu-01"))
    with pytest.raises(UsageError, match=r"no node ml-gpu1 at site mllab; its nodes"):
        resolve(mllab, JobRequest(script=TRAIN, model="a100", nodelist="ml-gpu1"))
    with pytest.raises(UsageError, match=r"no node ml-gpuu01 at site mllab \(did you mean "):
        resolve(mllab, JobRequest(script=TRAIN, model="a100", nodelist="ml-gpuu01"))


def test_a_known_node_without_the_gpus_still_says_what_it_lacks(mllab: Site) -> None:
    with pytest.raises(UsageError, match=r"--nodelist node\(s\) ml-gpu01 cannot give 3 A100"):
        resolve(mllab, JobRequest(script=TRAIN, model="a100", gpus=3, nodelist="ml-gpu01"))


# --- mistyped names ---------------------------------------------------------------------------


def test_a_mistyped_model_suggests_the_one_meant(mllab: Site) -> None:
    with pytest.raises(UsageError) as info:
        resolve(mllab, JobRequest(script=TRAIN, model="A10O"))
    assert str(info.value).startswith(
        "unknown GPU model 'A10O' at site mllab (did you mean A100?); this site has: A100"
    )
    with pytest.raises(UsageError, match=r"\(did you mean A100\?\)"):  # an alias mistyped
        resolve(mllab, JobRequest(script=TRAIN, model="a100-pcie-4Ogb"))
    with pytest.raises(UsageError) as other:  # another GPU is no typo of one here
        resolve(mllab, JobRequest(script=TRAIN, model="P100"))
    assert "did you mean" not in str(other.value)


def test_a_mistyped_partition_and_launcher_suggest_the_one_meant(mllab: Site) -> None:
    with pytest.raises(UsageError, match=r"^unknown partition 'dbeug' at site mllab \(did you "
                                         r"mean debug\?\); valid partitions: gpu"):  # fmt: skip
        resolve(mllab, JobRequest(script=TRAIN, model="a100", partition="dbeug"))
    with pytest.raises(UsageError, match=r"expected one of torchrun, srun, none \(did you mean "
                                         r"torchrun\?\)$"):  # fmt: skip
        resolve(mllab, JobRequest(script=TRAIN, model="a100", launcher="trochrun"))


@pytest.mark.parametrize(
    ("typed", "meant"),
    [
        ("A10O", "A100"),  # a letter O for a zero
        ("v1OO", "V100"),
        ("hpcc", "hpc"),  # one letter more
        ("dbug", "debug"),  # one letter less
        ("hcp", "hpc"),  # two swapped
        ("a100_80gb", "a100-80gb"),  # separators
        ("P100", None),  # another GPU
        ("A800", None),
        ("A10", None),  # the A10 is a GPU of its own
        ("gpu9", None),  # another node
        ("mpirun", None),
    ],
)
def test_did_you_mean_suggests_only_what_is_one_slip_away(typed: str, meant: str | None) -> None:
    names = ["A100", "V100", "hpc", "debug", "a100-80gb", "gpu1", "srun"]
    assert did_you_mean(typed, names) == (f" (did you mean {meant}?)" if meant else "")
