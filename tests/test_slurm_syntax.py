"""Slurm's value syntax (clusterjob.slurm.syntax): times, memory sizes, GRES type names.

One definition serves the site loader (partition time limits, defaults, GRES types) and the
job request (--time, --mem-per-gpu); the last test holds the two to the same acceptance.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from clusterjob.errors import UsageError
from clusterjob.jobscript.request import JobRequest, resolve
from clusterjob.site.loader import load_site, validate_site_file
from clusterjob.slurm.syntax import (
    GRES_TYPE_NAME,
    MAX_ARRAY_TASKS,
    MEMORY_SIZE,
    array_task_ids,
    is_time,
    split_array_id,
    time_seconds,
)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        # minutes
        ("90", 5400),
        ("0", 0),
        # minutes:seconds
        ("90:30", 5430),
        ("1:120", 180),  # Slurm takes any number of digits in every field
        # hours:minutes:seconds
        ("01:00:00", 3600),
        ("100:00:00", 360000),
        # days-hours
        ("2-00", 172800),
        ("2-3", 183600),
        # days-hours:minutes
        ("2-03:04", 183840),
        # days-hours:minutes:seconds
        ("1-00:00:01", 86401),
        ("2-00:00:00", 172800),
        # no limit, in any case (partition limits; Slurm compares case-insensitively)
        ("UNLIMITED", None),
        ("unlimited", None),
        ("Unlimited", None),
        ("INFINITE", None),
        ("infinite", None),
    ],
)
def test_time(text: str, seconds: int | None) -> None:
    assert time_seconds(text) == seconds
    assert is_time(text)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "1h",
        "2 days",
        "1:2:3:4",
        "1-2:3:4:5",
        "-5",
        "1-",
        "-1",
        "1-2-3",
        ":30",
        "30:",
        " 30",  # sbatch takes the value as written
        "30\n",
        "\u0661\u0662",  # digits, but not the ASCII ones Slurm reads
        "\u0131nfinite",  # upper-cases to INFINITE, but is not ASCII
        "soon",
    ],
)
def test_time_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="not a Slurm time"):
        time_seconds(text)
    assert not is_time(text)


@pytest.mark.parametrize("text", ["64G", "500M", "1T", "1024", "8K"])
def test_memory_size(text: str) -> None:
    assert MEMORY_SIZE.match(text)


@pytest.mark.parametrize("text", ["", "64GB", "64g", "1.5G", "G", "64G\n", " 64G", "-1G"])
def test_memory_size_rejects(text: str) -> None:
    assert not MEMORY_SIZE.match(text)


@pytest.mark.parametrize("text", ["a100", "nvidia_a100-sxm4-80gb", "A100.80GB", "3090"])
def test_gres_type_name(text: str) -> None:
    assert GRES_TYPE_NAME.match(text)


@pytest.mark.parametrize("text", ["", "a100:2", "a 100", "a100\n", "a100,b"])
def test_gres_type_name_rejects(text: str) -> None:
    assert not GRES_TYPE_NAME.match(text)


SITE = """\
site: t
gpu_request: {{syntax: gres}}
models:
  A100: {{gres_type: a100, nvml_names: ["NVIDIA A100-SXM4-80GB"]}}
partitions:
  gpu: {{nodes: n1, time_limit: {limit}}}
node_map:
  - nodes: n1
    gpus: [{{model: A100}}]
"""

SAMPLES = [
    "90",
    "90:30",
    "1:120",
    "01:00:00",
    "2-00",
    "2-03:04",
    "1-00:00:01",
    "UNLIMITED",
    "Infinite",
    "2 days",
    "1:2:3:4",
    "1-",
    "-5",
    "1h",
]


@pytest.mark.parametrize("text", SAMPLES)
def test_site_limit_and_request_time_accept_the_same(text: str, tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SITE.format(limit=f'"{text}"'))
    site, issues = validate_site_file(path)
    assert (site is not None) == is_time(text), issues
    unlimited = tmp_path / "u.yaml"
    unlimited.write_text(SITE.format(limit="UNLIMITED"))
    request = JobRequest("train.py", model="A100", time=text)
    if is_time(text):
        assert resolve(load_site(unlimited), request).time == text
    else:
        with pytest.raises(UsageError, match=re.escape(f"--time: not a Slurm time: {text!r}")):
            resolve(load_site(unlimited), request)


# -- job arrays: --array values and the ids squeue/sacct print -------------------------------


@pytest.mark.parametrize(
    ("spec", "ids"),
    [
        ("0-3", [0, 1, 2, 3]),
        ("0-9%2", list(range(10))),
        ("1,3,8-15:4", [1, 3, 8, 12]),
        ("[2-5%2]", [2, 3, 4, 5]),  # squeue's tasks not started yet
        (" 7 ", [7]),
        ("5-5", [5]),
        ("4,2,4", [2, 4]),
        ("0-10:5", [0, 5, 10]),
        ("[2-5]", [2, 3, 4, 5]),
        (f"1-{MAX_ARRAY_TASKS}", list(range(1, MAX_ARRAY_TASKS + 1))),
        # exactly the limit, counted in whole steps (1,000,000 tasks, not 1,000,000.5)
        (f"0-{2 * MAX_ARRAY_TASKS - 1}:2", list(range(0, 2 * MAX_ARRAY_TASKS, 2))),
    ],
)
def test_array_task_ids(spec: str, ids: list[int]) -> None:
    assert array_task_ids(spec) == ids


NOT_A_SPEC = "is not an array spec (e.g. 0-9, 0-9%2, 1,3,5, 0-15:4)"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("0-9%x", "'0-9%x': the %N task limit must be a number"),
        ("a-b", f"'a-b' {NOT_A_SPEC}"),
        ("1-2x", f"'1-2x' {NOT_A_SPEC}"),
        ("", f"'' {NOT_A_SPEC}"),
        ("[12", f"'[12' {NOT_A_SPEC}"),  # brackets come in pairs
        ("12]", f"'12]' {NOT_A_SPEC}"),
        ("5-3", "'5-3': range '5-3' is empty"),
        ("1-4:0", "'1-4:0': range '1-4:0' is empty"),
        (f"0-{MAX_ARRAY_TASKS}", f"'0-{MAX_ARRAY_TASKS}': more than {MAX_ARRAY_TASKS} tasks"),
        (f"1-{MAX_ARRAY_TASKS},0", f"'1-{MAX_ARRAY_TASKS},0': more than {MAX_ARRAY_TASKS} tasks"),
    ],
)
def test_array_task_ids_rejects(spec: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(why)}$"):
        array_task_ids(spec)


@pytest.mark.parametrize(
    ("job_id", "parts"),
    [("123", ("123", None)), ("123_4", ("123", "4")), ("123_[5-9%2]", ("123", "[5-9%2]"))],
)
def test_split_array_id(job_id: str, parts: tuple[str, str | None]) -> None:
    assert split_array_id(job_id) == parts
