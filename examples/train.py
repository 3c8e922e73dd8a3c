"""A stand-in for a training script: no torch, no GPU. It prints what a real one would rely on.

Every line is ``key=value`` (values are ``repr`` where they could hold anything), so tests
and people can read what reached the program: the launcher's rank variables, the GPUs Slurm
gave it, the node, and its exact argv.

    python examples/train.py [--exit-code N] [--sleep SECONDS] [anything else ...]

``--exit-code N`` makes it exit with N (to test failure paths); ``--sleep`` keeps it running
(to test cancellation and preemption signals). Other arguments are only printed.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

REPORTED_ENV = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURMD_NODENAME",
)


def _option(argv: list[str], name: str, default: str) -> str:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return default


def say(text: str) -> None:
    """One write() per call: a short write to a pipe is atomic, so lines of ranks that share
    an output file stay whole as long as each call stays small."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGUSR1, _on_usr1)
    # First, one short line per process: under torchrun several ranks share one output
    # file (and Slurm forwards it in 1 KiB pieces), and this line keeps each rank's view whole.
    summary = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "SLURMD_NODENAME",
               "CUDA_VISIBLE_DEVICES")  # fmt: skip
    say("rank-summary: " + " ".join(f"{n.lower()}={os.environ.get(n) or '-'}" for n in summary))
    for name in REPORTED_ENV:
        say(f"{name}={os.environ.get(name, '')}")
    say(f"hostname={socket.gethostname()}")
    say(f"argc={len(argv)}")
    for i, arg in enumerate(argv):
        say(f"argv[{i}]={arg!r}")
    try:
        exit_code = int(_option(argv, "--exit-code", "0"))
        sleep = float(_option(argv, "--sleep", "0"))
    except ValueError as exc:
        print(f"train.py: bad option value: {exc}", file=sys.stderr)
        return 2
    if sleep:
        time.sleep(sleep)
    say(f"exit={exit_code}")
    return exit_code


def _on_usr1(signum: int, frame: object) -> None:
    """Slurm's --signal warning: a real script would checkpoint here and requeue."""
    say("signal=USR1")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
