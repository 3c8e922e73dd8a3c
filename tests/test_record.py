"""``clusterjob.record.Record``: the frozen dataclass's behaviour, without dataclasses.

The hooks' data types moved from ``@dataclass(frozen=True)`` to ``Record``; what their users
relied on (equality by field, hashing, ``repr``, immutability, pickling for the site cache,
``replace``, ``asdict``) must be the same. And the NVML reader's inventory crosses the fork
as plain data (``marshal``): every field must come back as it went.
"""

from __future__ import annotations

import marshal
import pickle
from dataclasses import asdict, dataclass
from functools import cached_property

import pytest

from clusterjob.errors import ConfigIssue
from clusterjob.gpu.inventory import Gpu, GpuInventory, GpuProcess, MigDevice
from clusterjob.record import Record
from clusterjob.site.nodemodel import CheckPolicy, GresUnit, NodeGpu


class Point(Record):
    __slots__ = ("x", "y", "tags")
    x: int
    y: int
    tags: tuple[str, ...]

    def __init__(self, x: int, y: int = 0, tags: tuple[str, ...] = ()) -> None:
        self._fill(x, y, tags)


class Cached(Record):
    __slots__ = ("n", "__dict__")
    n: int

    def __init__(self, n: int) -> None:
        self._fill(n)

    @cached_property
    def squared(self) -> int:
        return self.n * self.n


@dataclass(frozen=True)
class DataPoint:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()


def test_a_record_compares_hashes_and_prints_as_the_frozen_dataclass_did() -> None:
    a, b = Point(1, 2, ("t",)), Point(1, 2, ("t",))
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != Point(1, 3, ("t",))
    assert a != (1, 2, ("t",))  # not a tuple: only a record of the same class is equal
    assert len({a, b, Point(2)}) == 2
    assert repr(a) == repr(DataPoint(1, 2, ("t",))).replace("DataPoint", "Point")


def test_a_record_is_frozen() -> None:
    a = Point(1)
    with pytest.raises(AttributeError, match="cannot assign to field 'x': Point is frozen"):
        a.x = 2  # type: ignore[misc]
    with pytest.raises(AttributeError, match="cannot delete field 'y'"):
        del a.y
    with pytest.raises(AttributeError):
        a.other = 1  # type: ignore[attr-defined]  # no __dict__: no new attributes either
    assert a.x == 1


def test_replace_and_as_dict_are_dataclasses_replace_and_asdict() -> None:
    a = Point(1, 2, ("t",))
    assert a.replace(y=5) == Point(1, 5, ("t",)) and a == Point(1, 2, ("t",))
    with pytest.raises(TypeError, match="Point has no field 'z'"):
        a.replace(z=1)
    unit = GresUnit(3, NodeGpu(1, "A100", mig=("3g.40gb",)), 0)
    assert unit.as_dict() == {
        "index": 3,
        "slot": {
            "slot": 1,
            "model": "A100",
            "bus_id": None,
            "uuid": None,
            "nvlinks": None,
            "mig": ("3g.40gb",),
            "mig_gi": None,
        },
        "slice": 0,
    }
    assert Point(1, 2, ("t",)).as_dict() == asdict(DataPoint(1, 2, ("t",)))


def test_records_pickle_as_the_site_cache_keeps_them() -> None:
    policy = CheckPolicy("535.0", {"gpu-hot": "off"}, "12.4")
    issue = ConfigIssue("site.yaml", 3, "models.A100", "bad", warning=True)
    for value in (policy, issue, Point(1, 2, ("t",)), GresUnit(0, NodeGpu(0, "H100"))):
        back = pickle.loads(pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        assert back == value and type(back) is type(value)


def test_a_record_with_a_dict_slot_has_cached_properties_that_are_no_fields() -> None:
    c = Cached(4)
    assert c.squared == 16 and c.squared == 16
    assert c == Cached(4) and c.as_dict() == {"n": 4} and repr(c) == "Cached(n=4)"
    assert pickle.loads(pickle.dumps(c)) == c


def test_defaults_made_per_instance_are_not_shared() -> None:
    a, b = CheckPolicy(), CheckPolicy()
    assert a.severity == {} and a.severity is not b.severity


FULL_GPU = Gpu(
    0,
    "0000:07:00.0",
    "NVIDIA A100-SXM4-80GB",
    "GPU-1",
    serial="S1",
    minor=0,
    memory_total=80 << 30,
    mig_current=True,
    mig_pending=False,
    ecc_uncorrectable_volatile=0,
    remapped_rows_pending=False,
    remapped_rows_failure=False,
    persistence_mode=True,
    lost=False,
    memory_used=1 << 20,
    processes=(GpuProcess(42, 1 << 20, "python", "alice"), GpuProcess(43, None, None)),
    pcie_link_width=16,
    pcie_link_width_max=16,
    pcie_link_gen=4,
    pcie_link_gen_max=4,
    temperature=40,
    temperature_slowdown=90,
    clock_event_reasons=0x1,
    nvlink_active=(True, False),
    fabric_state="completed",
    fabric_status=0,
    cpu_affinity="0-31",
    mig_devices=(MigDevice(0, "MIG-1", "NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 << 30, 1, 0),),
    power_limit=400000,
    power_limit_default=400000,
    retired_pages_pending=False,
)


@pytest.mark.parametrize(
    "inventory",
    [
        GpuInventory((FULL_GPU, Gpu(1, "0000:0b:00.0", None, None)), "550.54.15", 12040),
        GpuInventory((), None, None),
    ],
    ids=["every field set", "nothing known"],
)
def test_an_inventory_crosses_the_fork_as_plain_data_and_comes_back_equal(
    inventory: GpuInventory,
) -> None:
    """What the forked NVML reader sends (``as_dict``, through ``marshal``) is read back
    (``from_dict``) into an equal inventory: no field lost, none turned into another type."""
    back = GpuInventory.from_dict(marshal.loads(marshal.dumps(inventory.as_dict())))
    assert back == inventory
    assert [type(g.processes) for g in back.gpus] == [type(g.processes) for g in inventory.gpus]
    if inventory.gpus:
        assert list(inventory.as_dict()["gpus"][0]) == list(Gpu._fields)
