"""``clusterjob.gpu.isolation.start_in_child``: a read in a forked child, its answer back as
plain data (``marshal``), or the error it raised, or ``ReadTimedOut`` when it hangs."""

from __future__ import annotations

import os
import signal
import time

import pytest

from clusterjob.errors import NvmlError, NvmlErrorKind
from clusterjob.gpu import isolation


def test_a_childs_plain_data_comes_back_as_it_was_sent() -> None:
    sent = {"gpus": ({"bus_id": "0000:07:00.0", "links": (True, False)},), "n": None, "v": 1.5}
    assert isolation.start_in_child(lambda: sent).result(10) == sent


def test_an_nvml_error_in_the_child_is_raised_here_as_it_was() -> None:
    def read() -> None:
        raise NvmlError(NvmlErrorKind.GPU_LOST, "GPU at NVML index 1 is lost")

    with pytest.raises(NvmlError) as info:
        isolation.start_in_child(read).result(10)
    assert (info.value.kind, str(info.value)) == (
        NvmlErrorKind.GPU_LOST,
        "GPU at NVML index 1 is lost",
    )


def test_any_other_exception_is_an_unknown_nvml_error_naming_it() -> None:
    def read() -> None:
        raise KeyError("busId")

    with pytest.raises(NvmlError) as info:
        isolation.start_in_child(read).result(10)
    assert (info.value.kind, str(info.value)) == (NvmlErrorKind.UNKNOWN, "KeyError: 'busId'")


def test_an_answer_marshal_cannot_write_is_an_error_not_a_hang_or_a_wrong_value() -> None:
    """A reader that returned an object (not plain data) is a bug: said as one, at once."""
    start = time.monotonic()
    with pytest.raises(NvmlError) as info:
        isolation.start_in_child(object).result(10)
    assert time.monotonic() - start < 5
    assert info.value.kind is NvmlErrorKind.UNKNOWN
    assert str(info.value).startswith("the reader's answer: "), str(info.value)


def test_a_hung_child_times_out_and_is_killed() -> None:
    reading = isolation.start_in_child(lambda: time.sleep(60))
    with pytest.raises(isolation.ReadTimedOut):
        reading.result(0.5)
    start = time.monotonic()
    try:  # killed: reaped already, or a zombie whose status says SIGKILL (not a sleeper)
        _, status = os.waitpid(reading.pid, 0)
    except ChildProcessError:
        return
    assert time.monotonic() - start < 5
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
