"""What a command leaves until after its answer (clusterjob/lifetime.py): nothing where no
answer comes first; in a served worker, every release after it, oldest first, at most
``MOST_PENDING`` of them waiting. The served half (a registry's connection closed after the
client has its exit status) is in tests/test_command_server.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from clusterjob import lifetime


@pytest.fixture(autouse=True)
def _no_answer_left_pending() -> Iterator[None]:
    yield
    lifetime.answered()  # the module's state is the process's: leave it as found


def test_a_release_runs_at_once_where_no_answer_comes_first() -> None:
    done: list[str] = []
    lifetime.after_answer(lambda: done.append("closed"))
    assert done == ["closed"]


def test_after_answer_first_releases_wait_for_the_answer_and_run_in_order() -> None:
    done: list[int] = []
    lifetime.answer_first()
    for n in range(3):
        lifetime.after_answer(lambda n=n: done.append(n))
    assert done == []
    lifetime.answered()
    assert done == [0, 1, 2]
    lifetime.after_answer(lambda: done.append(3))  # answered: back to at once
    assert done == [0, 1, 2, 3]


def test_no_more_than_most_pending_wait_the_oldest_runs_first() -> None:
    done: list[int] = []
    lifetime.answer_first()
    for n in range(lifetime.MOST_PENDING + 2):
        lifetime.after_answer(lambda n=n: done.append(n))
    assert done == [0, 1]  # a command that loops (status --watch) holds no more than that
    lifetime.answered()
    assert done == list(range(lifetime.MOST_PENDING + 2))


def test_a_release_that_fails_does_not_stop_the_others() -> None:
    done: list[str] = []

    def broken() -> None:
        raise OSError("disk gone")

    lifetime.answer_first()
    lifetime.after_answer(broken)
    lifetime.after_answer(lambda: done.append("closed"))
    lifetime.answered()
    assert done == ["closed"]
