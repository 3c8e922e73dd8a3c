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
from clusterjob.slurm.syntax import GRES_TYPE_NAME, MEMORY_SIZE, is_time, time_seconds


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
