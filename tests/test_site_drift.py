"""``site diff`` logic: the node map against recorded ``scontrol show node -o -d`` and
``scontrol show partition -o`` output (sandbox recordings and a hand-written 24.05 partition
listing). The same against the live sandbox is in tests/e2e/test_admin.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.site.drift import compare, format_report, is_prolog_reason
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.parse import parse_scontrol_nodes, parse_scontrol_partitions

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"
SITE_TEXT = (FIXTURES / "sandbox_site.yaml").read_text()


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def site_from(tmp_path: Path, text: str) -> Site:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return load_site(path)


def edited(*replacements: tuple[str, str]) -> str:
    text = SITE_TEXT
    for old, new in replacements:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    return text


H1_ENTRY = "".join(
    f'      - {{model: H100, bus_id: "0000:{b}:00.0"}}\n'
    for b in ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
)


def test_parse_recorded_partitions():
    parts = parse_scontrol_partitions(read("scontrol_show_partition_sandbox.txt"))
    assert [(p.name, p.nodes, p.default, p.state, p.max_time) for p in parts] == [
        ("gpu", "gpu[1-2]", True, "UP", "2-00:00:00"),
        ("suspect", "gpu3", False, "UP", "2-00:00:00"),
        ("h100", "h1", False, "UP", "2-00:00:00"),
    ]


def test_parse_newer_partitions_handwritten():
    parts = parse_scontrol_partitions(read("scontrol_show_partition_2405_handwritten.txt"))
    assert [(p.name, p.nodes, p.default, p.state) for p in parts] == [
        ("h100", "new[01-02]", True, "UP"),
        ("empty", None, False, "INACTIVE"),
    ]
    assert parts[0].raw["JobDefaults"] == "DefMemPerGPU=65536"


def test_in_sync_with_recorded_cluster(tmp_path):
    site = site_from(tmp_path, SITE_TEXT)
    report = compare(
        site,
        parse_scontrol_nodes(read("scontrol_show_node_detail_sandbox_h1_busy.txt")),
        parse_scontrol_partitions(read("scontrol_show_partition_sandbox.txt")),
    )
    assert report.in_sync, report
    assert format_report(report) == ["site sandbox: node map in sync with Slurm"]


def test_prolog_drain_is_drift_other_drain_is_a_note(tmp_path):
    site = site_from(tmp_path, SITE_TEXT)
    parts = parse_scontrol_partitions(read("scontrol_show_partition_sandbox.txt"))
    report = compare(
        site,
        parse_scontrol_nodes(read("scontrol_show_node_detail_sandbox_prolog_drain.txt")),
        parts,
    )
    assert not report.in_sync
    assert [(d.node, d.state) for d in report.prolog_drained] == [("gpu3", "IDLE+DRAIN")]
    assert report.prolog_drained[0].reason.startswith("Prolog error [root@")
    assert not (report.gres or report.partitions or report.not_in_map or report.not_in_slurm)
    lines = format_report(report)
    assert any(line.startswith("drained by the clusterjob Prolog: gpu3") for line in lines)
    # the map itself matches Slurm: the verdict names the drain, not a node-map difference
    assert lines[-1] == (
        "site sandbox: node map matches Slurm; drained by the clusterjob Prolog: gpu3"
    )

    nodes = parse_scontrol_nodes(read("scontrol_show_node_drain_invalid.txt"))
    other = compare(site, nodes, parts)
    assert other.other_drained[0].reason.startswith("Low socket*core*thread count")
    assert other.prolog_drained == ()


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("Prolog error [root@2026-11-29T16:38:59]", True),
        ("clusterjob: GPU 1 is V100, map says A100 [root@2026-11-29T16:39:52]", True),
        ("Not responding [slurm@2021-03-02T08:00:00]", False),
        ("maintenance: clusterjob test", False),
        (None, False),
    ],
)
def test_prolog_reasons(reason, expected):
    assert is_prolog_reason(reason) is expected


def test_modified_site_copy(tmp_path):
    """A node removed from the map, a GRES count changed, an extra node and a partition edit."""
    text = edited(
        ("  - nodes: h1\n    gpus:\n" + H1_ENTRY, ""),
        ('    nodes: "h1"\n', '    nodes: "gpu9"\n'),
        (
            '  - nodes: gpu2\n    gpus:\n      - {model: A100, bus_id: "0000:07:00.0"}\n',
            "  - nodes: gpu2\n    gpus:\n",
        ),
        ("prolog:\n", "  - nodes: gpu9\n    gpus:\n      - {model: H100}\nprolog:\n"),
    )
    site = site_from(tmp_path, text)
    report = compare(
        site,
        parse_scontrol_nodes(read("scontrol_show_node_detail_sandbox_h1_busy.txt")),
        parse_scontrol_partitions(read("scontrol_show_partition_sandbox.txt")),
    )
    assert report.not_in_map == ("h1",)
    assert report.not_in_slurm == ("gpu9",)
    assert [(g.node, g.expected, g.actual) for g in report.gres] == [
        ("gpu2", "gpu:a100:1,gpu:v100:2", "gpu:a100:2,gpu:v100:2")
    ]
    assert [(p.partition, p.only_in_map, p.only_in_slurm) for p in report.partitions] == [
        ("h100", ("gpu9",), ("h1",))
    ]
    lines = format_report(report)
    assert lines[:4] == [
        "in Slurm, not in the node map: h1 (add them with `clusterjob site probe --merge` on "
        "each node)",
        "in the node map, not in Slurm: gpu9",
        "GRES differs on gpu2: node map says gpu:a100:1,gpu:v100:2, Slurm has "
        "gpu:a100:2,gpu:v100:2 (regenerate with `clusterjob site gres-conf`)",
        "partition h100: nodes differ (site only: gpu9; Slurm only: h1)",
    ]
    assert lines[-1] == "site sandbox: node map differs from Slurm"


def test_partition_missing_on_either_side(tmp_path):
    text = edited(("  h100:\n", "  h200:\n"))
    site = site_from(tmp_path, text)
    report = compare(
        site,
        parse_scontrol_nodes(read("scontrol_show_node_detail_sandbox_h1_busy.txt")),
        parse_scontrol_partitions(read("scontrol_show_partition_sandbox.txt")),
    )
    assert [(p.partition, p.missing_in_slurm, p.missing_in_site) for p in report.partitions] == [
        ("h200", True, False),
        ("h100", False, True),
    ]
