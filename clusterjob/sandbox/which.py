"""Which sandbox a `clusterjob sandbox` command means: one rule for up, down, status, env, exec.

- The release: ``--slurm R``, else ``CLUSTERJOB_SANDBOX_SLURM``. One the host does not ship
  runs in a Debian root of its own (``clusterjob.sandbox.releases``).
- The state directory: ``--state-dir``, else ``CLUSTERJOB_SANDBOX_DIR``, else the release's
  default (``/var/lib/clusterjob-sandbox``, ``/var/lib/clusterjob-sandbox-24.11`` ...). It
  means the same for every release: `up --slurm 24.11` with the variable set keeps that
  release's state there, and `exec` finds it there.
- Neither named: the host's sandbox; for `exec`, the one release sandbox that is up, if any
  (several up is a usage error asking for ``--slurm``). `exec` refuses a sandbox that is not
  up rather than run the command on the host.

Before, `up --slurm R` ignored the variable while `exec` honoured it, so a command given to
what looked like the 24.11 sandbox ran on the host against another cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from clusterjob.errors import UsageError
from clusterjob.sandbox import config, releases


@dataclass(frozen=True)
class SandboxChoice:
    """The sandbox a command means, and why (printed by `sandbox status`)."""

    release: releases.Release | None  # None: the host's own Slurm
    state_dir: Path
    why: str

    def describe(self) -> str:
        where = "the host's Slurm" if self.release is None else f"Slurm {self.release.version}"
        inside = "" if self.release is None else f" in the {self.release.suite} root"
        return f"sandbox: {where}{inside}, state in {self.state_dir} ({self.why})"


def choose(slurm: str | None, state_dir: Path | None, *, any_up: bool = False) -> SandboxChoice:
    """The sandbox ``--slurm`` (or its variable) and ``--state-dir`` (or its variable) name.
    ``any_up``: with neither named, the one release sandbox that is up (`exec`)."""
    named, why = config.named_state_dir(state_dir)
    if slurm is not None:
        rel = releases.release(slurm, named)  # an unknown release is refused here
        if releases.needs_root(slurm):
            return SandboxChoice(rel, rel.state_dir, f"--slurm {slurm}, state dir: {why}")
        return SandboxChoice(None, named or config.DEFAULT_STATE_DIR, f"state dir: {why}")
    mounted = releases.mounted_releases()
    if named is not None:
        for rel in mounted:
            if releases.holds_state_dir(rel, named):
                return SandboxChoice(
                    releases.release(rel.version, named), named, f"{why}, up in that root"
                )
        return SandboxChoice(None, named, why)
    if any_up and mounted:
        if len(mounted) > 1:
            names = ", ".join(r.version for r in mounted)
            raise UsageError(f"several sandboxes are up ({names}); pick one with --slurm")
        rel = mounted[0]
        return SandboxChoice(rel, rel.state_dir, f"the one release sandbox up, {rel.version}")
    return SandboxChoice(None, config.DEFAULT_STATE_DIR, why)


def require_up(choice: SandboxChoice) -> None:
    """`exec` runs nothing against a sandbox that is not up (it used to run on the host)."""
    from clusterjob.sandbox import cluster

    if choice.release is not None:
        up = releases.is_mounted(choice.release) and (choice.state_dir / "slurm.conf").exists()
    else:
        up = cluster.controller_running(choice.state_dir)
    if not up:
        hint = "" if choice.release is None else f" --slurm {choice.release.version}"
        state = f" --state-dir {choice.state_dir}" if "default" not in choice.why else ""
        raise UsageError(
            f"{choice.describe()} is not up: start it with `clusterjob sandbox up{hint}{state}`"
        )
