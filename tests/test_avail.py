"""GRES parsing and free-GPU counting, over Slurm output recorded from the sandbox (22.05) and
hand-written older (20.11) and newer (24.05/25.05) formats (see tests/fixtures/slurm/README.md).

The live check (a job holding h1's 8 H100s) is in tests/e2e/test_admin.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterjob.errors import UsageError
from clusterjob.jobs.avail import format_availability, summarise
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.parse import (
    GresEntry,
    alloc_tres_gpu_counts,
    gpu_counts,
    node_unavailable,
    parse_gres,
    parse_scontrol_nodes,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def nodes(name: str):
    return parse_scontrol_nodes((FIXTURES / name).read_text())


@pytest.fixture(scope="module")
def sandbox_site() -> Site:
    return load_site(FIXTURES / "sandbox_site.yaml")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:a100:2,gpu:v100:2", [GresEntry("gpu", "a100", 2), GresEntry("gpu", "v100", 2)]),
        (
            "gpu:a100:2(IDX:0-1),gpu:v100:0(IDX:N/A)",
            [GresEntry("gpu", "a100", 2, "0-1"), GresEntry("gpu", "v100", 0)],
        ),
        ("gpu:h100:4(IDX:0-1,4-5)", [GresEntry("gpu", "h100", 4, "0-1,4-5")]),
        ("gpu:h100:8(S:0-1)", [GresEntry("gpu", "h100", 8)]),
        (
            "gpu:a40:1(S:0,2,4,6,8,10),mps:100(S:0,2,4,6,8,10)",
            [GresEntry("gpu", "a40", 1), GresEntry("mps", None, 100)],
        ),
        ("gpu:4", [GresEntry("gpu", None, 4)]),
        ("gpu:(null):0(IDX:N/A)", [GresEntry("gpu", None, 0)]),
        ("gpu", [GresEntry("gpu", None, 1)]),
        ("gpu:nvidia_a100-sxm4-80gb:8", [GresEntry("gpu", "nvidia_a100-sxm4-80gb", 8)]),
        ("gpu:a100_3g.20gb:2", [GresEntry("gpu", "a100_3g.20gb", 2)]),
        ("(null)", []),
        (None, []),
    ],
)
def test_parse_gres(text, expected):
    assert parse_gres(text) == expected


def test_parse_gres_leaves_an_unknown_item_out_and_says_so_at_debug_level(caplog):
    """One item of a form it cannot read must not stop `avail` or `site diff` for every node."""
    with caplog.at_level("DEBUG", logger="clusterjob.slurm"):
        entries = parse_gres("gpu:a:b:c:2,gpu:a100:2")
    assert entries == [GresEntry("gpu", "a100", 2)]
    assert "gpu:a:b:c:2" in caplog.text


def test_gpu_counts_leave_other_gres_out():
    assert gpu_counts("gpu:a40:1(S:0,2),mps:100(S:0,2)") == {"a40": 1}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("cpu=16,gres/gpu=2,gres/gpu:v100=2", {"v100": 2}),
        ("cpu=8,mem=62.50G,gres/gpu=1", {None: 1}),
        ("", {}),
        ("cpu=1", {}),
    ],
)
def test_alloc_tres_gpu_counts(text, expected):
    assert alloc_tres_gpu_counts(text) == expected


def test_recorded_sandbox_busy_and_drained(sandbox_site):
    """Recorded with a job holding all 8 H100s of h1 and gpu2 drained by hand."""
    recorded = nodes("scontrol_show_node_detail_sandbox_busy_drain.txt")
    by_name = {n.name: n for n in recorded}
    assert gpu_counts(by_name["h1"].gres_used) == {"h100": 8}
    assert parse_gres(by_name["h1"].gres_used)[0].indices == "0-7"
    assert node_unavailable(by_name["gpu2"]) and not node_unavailable(by_name["h1"])

    avail = summarise(sandbox_site, recorded)
    rows = {(r.partition, r.model): r for r in avail.rows}
    assert (rows["h100", "H100"].free, rows["h100", "H100"].total) == (0, 8)
    assert rows["h100", "H100"].nodes_free == ()
    # gpu2 is drained: only gpu1's GPUs count in partition gpu
    assert (rows["gpu", "A100"].free, rows["gpu", "A100"].total) == (2, 2)
    assert rows["gpu", "A100"].nodes_free == ("gpu1",)
    assert [(s.node, s.state) for s in avail.skipped] == [("gpu2", "IDLE+DRAIN")]
    assert avail.skipped[0].reason.startswith("clusterjob: GPU 1 is V100")
    text = "\n".join(format_availability(avail))
    assert "not counted: gpu2 is IDLE+DRAIN: clusterjob: GPU 1 is V100" in text


def test_filters_by_model_alias_and_partition(sandbox_site):
    """Recorded after a job on gpu3 made the clusterjob Prolog fail there."""
    recorded = nodes("scontrol_show_node_detail_sandbox_prolog_drain.txt")
    avail = summarise(sandbox_site, recorded, model="a100-sxm4-80gb")
    assert {(r.partition, r.model, r.free) for r in avail.rows} == {("gpu", "A100", 4)}
    assert [s.node for s in avail.skipped] == ["gpu3"]  # Prolog error: not counted
    only_h100 = summarise(sandbox_site, recorded, partition="h100")
    assert [(r.partition, r.model, r.free) for r in only_h100.rows] == [("h100", "H100", 8)]
    assert only_h100.skipped == ()  # gpu3 is not in partition h100
    with pytest.raises(UsageError, match="unknown GPU model 'b200'.*A100, V100, H100"):
        summarise(sandbox_site, recorded, model="b200")


def test_older_format_without_idx_and_untyped(sandbox_site):
    """20.11-style (hand-written): GresUsed without IDX, untyped gpu:(null), DOWN*, and no
    GresUsed at all (AllocTRES is used instead)."""
    recorded = nodes("scontrol_show_node_detail_2011_handwritten.txt")
    avail = summarise(sandbox_site, recorded)
    free = {(r.model, r.total): r.free for r in avail.rows}
    # old01 (1 of 4 used) and old04 (2 of 4, from AllocTRES): V100 is the site's v100 type
    assert free[("V100", 8)] == 5
    assert free[("gpu", 4)] == 4  # untyped, node not in the map: shown as "gpu"
    assert [(s.node, s.state) for s in avail.skipped] == [("old03", "DOWN*+DRAIN")]


def test_newer_format_socket_suffix_and_flags(sandbox_site):
    """24.05/25.05-style (hand-written from the documented shapes): (S:...) suffixes with
    commas, IDLE+DRAIN+DYNAMIC_NORM, an mps GRES beside the GPU."""
    recorded = nodes("scontrol_show_node_detail_2405_handwritten.txt")
    avail = summarise(sandbox_site, recorded)
    rows = {(r.partition, r.model): r for r in avail.rows}
    assert (rows["h100", "H100"].free, rows["h100", "H100"].total) == (4, 8)
    assert (rows["preempt", "H100"].free, rows["preempt", "H100"].total) == (4, 8)
    assert rows["a40", "a40"].free == 1  # a type no site model has keeps Slurm's name
    assert [s.node for s in avail.skipped] == ["new02"]
    assert recorded[2].state == "IDLE" and recorded[2].flags == ("DYNAMIC_NORM",)
    assert not node_unavailable(recorded[2])


def test_recorded_sandbox_h1_busy(sandbox_site):
    """Recorded while another job held all of h1's H100s (h1 MIXED) and nothing was drained."""
    avail = summarise(sandbox_site, nodes("scontrol_show_node_detail_sandbox_h1_busy.txt"))
    assert {(r.partition, r.model): (r.free, r.total) for r in avail.rows} == {
        ("gpu", "A100"): (4, 4),
        ("gpu", "V100"): (4, 4),
        ("suspect", "A100"): (2, 2),
        ("suspect", "V100"): (2, 2),
        ("h100", "H100"): (0, 8),
    }
    assert avail.skipped == ()
