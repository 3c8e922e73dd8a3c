"""python-hostlist (what the site loader and request checks use) against Slurm's own
`scontrol show hostnames` / `scontrol show hostlist`, on generated hostlists.

Those two subcommands work offline (no controller needed), but scontrol wants a config:
the sandbox's slurm.conf is used when it exists, so the test runs where Slurm is installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import hostlist
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterjob.sandbox import config
from clusterjob.sandbox.cluster import resolve_state_dir

pytestmark = pytest.mark.slurm


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    if shutil.which("scontrol") is None:
        pytest.skip("Slurm's scontrol is not installed")
    conf = config.Layout(resolve_state_dir()).slurm_conf
    if not conf.exists():
        pytest.skip(f"no sandbox slurm.conf at {conf} (clusterjob sandbox up)")
    return {**os.environ, "SLURM_CONF": str(conf)}


def scontrol(env: dict[str, str], what: str, arg: str) -> str:
    proc = subprocess.run(["scontrol", "show", what, arg], env=env, capture_output=True,
                          text=True, timeout=30, check=True)  # fmt: skip
    return proc.stdout


# node names as sites write them: a prefix, a number, zero padding; some without numbers
prefixes = st.sampled_from(["gpu", "n", "node-", "a100-", "h", "x1y"])


@st.composite
def node_names(draw: st.DrawFn) -> list[str]:
    names = []
    for _ in range(draw(st.integers(1, 4))):
        prefix = draw(prefixes)
        width = draw(st.integers(1, 4))
        start = draw(st.integers(0, 10**width - 1))
        count = draw(st.integers(1, 12))
        names += [f"{prefix}{i:0{width}d}" for i in range(start, min(start + count, 10**width))]
    if draw(st.booleans()):
        names.append(draw(prefixes).rstrip("-"))
    return names


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(names=node_names())
def test_compression_and_expansion_agree_with_slurm(
    slurm_env: dict[str, str], names: list[str]
) -> None:
    ours = hostlist.collect_hostlist(names)
    # Slurm expands our compressed form to the same set of hosts...
    slurm_expanded = scontrol(slurm_env, "hostnames", ours).split()
    assert sorted(set(slurm_expanded)) == sorted(set(names)), ours
    # ...and our expansion of Slurm's compressed form gives the same set back.
    slurm_compressed = scontrol(slurm_env, "hostlist", ",".join(names)).strip()
    assert sorted(set(hostlist.expand_hostlist(slurm_compressed))) == sorted(set(names))


@settings(max_examples=100, deadline=None)
@given(
    prefix=prefixes,
    ranges=st.lists(
        st.tuples(st.integers(0, 200), st.integers(0, 30), st.integers(1, 3)), min_size=1,
        max_size=4,
    ),
)  # fmt: skip
def test_bracket_expressions_expand_like_slurm(
    slurm_env: dict[str, str], prefix: str, ranges: list[tuple[int, int, int]]
) -> None:
    """Ranges with padding, in one bracket: n[001-005,017,020-023]."""
    parts = []
    for start, length, width in ranges:
        stop = start + length
        parts.append(f"{start:0{width}d}" if length == 0 else f"{start:0{width}d}-{stop:0{width}d}")
    expression = f"{prefix}[{','.join(parts)}]"
    ours = hostlist.expand_hostlist(expression)
    theirs = scontrol(slurm_env, "hostnames", expression).split()
    assert sorted(set(ours)) == sorted(set(theirs)), expression
