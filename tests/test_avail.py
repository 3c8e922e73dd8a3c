"""GRES parsing and free-GPU counting, over Slurm output recorded from the sandbox (22.05) and
hand-written older (20.11) and newer (24.05/25.05) formats (see tests/fixtures/slurm/README.md).

The live check (a job holding h1's 8 H100s) is in tests/e2e/test_admin.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slurm_fake import FakeSlurm

from clusterjob.errors import UsageError
from clusterjob.jobs.avail import (
    Availability,
    SkippedNode,
    availability,
    format_availability,
    summarise,
)
from clusterjob.jobs.registry import Registry
from clusterjob.site.loader import load_site
from clusterjob.site.model import Site
from clusterjob.slurm.parse import (
    GresEntry,
    StartEstimate,
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


# -- availability(): nodes from scontrol, and Slurm's estimate through sbatch --test-only ------


class NodeSlurm(FakeSlurm):
    """The fake cluster, with recorded ``scontrol show node`` output and the test-only
    scripts it was given."""

    def __init__(self, node_fixture: str) -> None:
        super().__init__()
        self.node_text = (FIXTURES / node_fixture).read_text()
        self.scripts: list[str] = []

    def _scontrol(self, cmd, timeout):  # type: ignore[no-untyped-def]
        if cmd[1:3] == ["show", "node"]:
            return self._ok(cmd, self.node_text)
        return super()._scontrol(cmd, timeout)

    def _sbatch(self, cmd, timeout):  # type: ignore[no-untyped-def]
        self.scripts.append(Path(cmd[-1]).read_text())
        return super()._sbatch(cmd, timeout)


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CLUSTERJOB_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_availability_with_an_estimate(sandbox_site: Site, data: Path) -> None:
    slurm = NodeSlurm("scontrol_show_node_detail_sandbox_prolog_drain.txt")
    avail = availability(sandbox_site, gpus=2, model="a100", client=slurm.client())
    assert format_availability(avail) == [
        "PARTITION  MODEL  FREE/TOTAL  MOST ON ONE NODE",
        "gpu        A100          4/4  2",
        "not counted: gpu3 is IDLE+DRAIN: Prolog error [root@2026-11-29T16:42:22]",
        "a job of 2 x A100 would start at 2026-11-29 16:18:15 on gpu1 (partition gpu; "
        "Slurm's estimate, nothing submitted)",
    ]
    assert avail.to_dict() == {
        "site": "sandbox",
        "rows": (
            {"partition": "gpu", "model": "A100", "free": 4, "total": 4,
             "most_on_one_node": 2, "nodes_free": ("gpu1", "gpu2")},
        ),
        "skipped": (
            {"node": "gpu3", "state": "IDLE+DRAIN",
             "reason": "Prolog error [root@2026-11-29T16:42:22]"},
        ),
        "unknown_use": (),
        "estimate": {"start": "2026-11-29T16:18:15", "start_text": "2026-11-29T16:18:15",
                     "nodes": "gpu1", "partition": "gpu", "processors": 1},
        "request": "2 x A100",
        "avoided": (),
    }  # fmt: skip
    [node_query, test_only] = slurm.calls
    assert node_query == ["scontrol", "show", "node", "-o", "-d"]
    assert test_only[:2] == ["sbatch", "--test-only"]
    [script] = slurm.scripts  # the job submit would send: 2 A100s, nothing recorded
    assert "#SBATCH --gres=gpu:a100:2" in script.splitlines()
    assert "#SBATCH --job-name=clusterjob-avail" in script.splitlines()
    assert not (data / "jobs.sqlite").exists() or not Registry().all()


def test_availability_without_gpus_asks_no_estimate(sandbox_site: Site, data: Path) -> None:
    slurm = NodeSlurm("scontrol_show_node_detail_sandbox_h1_busy.txt")
    avail = availability(sandbox_site, partition="h100", client=slurm.client())
    assert (avail.estimate, avail.request) == (None, None)
    assert avail.to_dict()["estimate"] is None
    assert [r.partition for r in avail.rows] == ["h100"]
    assert [c[0] for c in slurm.calls] == ["scontrol"]
    h100 = availability(sandbox_site, gpus=1, model="H100-80GB", client=slurm.client())
    assert h100.request == "1 x H100"  # the site's name for the alias
    assert "#SBATCH --gres=gpu:h100:1" in slurm.scripts[-1].splitlines()


def test_availability_refusals(sandbox_site: Site, data: Path) -> None:
    slurm = NodeSlurm("scontrol_show_node_detail_sandbox_h1_busy.txt")
    with pytest.raises(UsageError) as info:
        availability(sandbox_site, partition="nope", client=slurm.client())
    assert str(info.value) == (
        "unknown partition 'nope' at site sandbox; partitions: gpu, suspect, h100"
    )
    assert slurm.calls == []
    with pytest.raises(UsageError, match=r"^--gpus must be at least 1$"):
        availability(sandbox_site, gpus=0, client=slurm.client())
    assert [c[0] for c in slurm.calls] == ["scontrol"]  # nothing sent to sbatch


def test_format_availability_without_rows_and_with_unknown_use() -> None:
    avail = Availability(
        site="s",
        rows=(),
        skipped=(SkippedNode("n1", "DOWN*", None),),
        unknown_use=("n2", "n3"),
        estimate=StartEstimate("7", "Unknown", None, 0, "gpu1", "gpu"),
        request="1 x GPU",
    )
    assert format_availability(avail) == [
        "no usable GPUs match",
        "not counted: n1 is DOWN*",
        "not counted: Slurm did not report GPUs in use on n2, n3",
        "a job of 1 x GPU would start at never (Unknown) on gpu1 (partition gpu; "
        "Slurm's estimate, nothing submitted)",
    ]


def test_untyped_gres_is_named_by_the_node_map(sandbox_site: Site) -> None:
    """`gpu:8` on h1, whose map has only H100s, is H100; on gpu1 (A100 and V100) only "gpu"."""
    text = (FIXTURES / "scontrol_show_node_detail_sandbox_h1_busy.txt").read_text()
    untyped = text.replace("gpu:h100:", "gpu:").replace("gpu:a100:2,gpu:v100:2", "gpu:4")
    untyped = untyped.replace("gpu:a100:0(IDX:N/A),gpu:v100:0(IDX:N/A)", "gpu:0(IDX:N/A)")
    rows = {
        (r.partition, r.model): (r.free, r.total)
        for r in summarise(sandbox_site, parse_scontrol_nodes(untyped)).rows
    }
    assert rows[("h100", "H100")] == (0, 8)
    assert rows[("gpu", "gpu")] == (8, 8)


def test_the_estimate_asks_for_the_partition_given(sandbox_site: Site, data: Path) -> None:
    slurm = NodeSlurm("scontrol_show_node_detail_sandbox_h1_busy.txt")
    availability(sandbox_site, gpus=1, model="a100", partition="suspect", client=slurm.client())
    assert "#SBATCH --partition=suspect" in slurm.scripts[-1].splitlines()
