"""The user's private runtime directory, for clusterjob's sockets.

``$CLUSTERJOB_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/clusterjob``, else
``/tmp/clusterjob-UID``: created with mode 0700 and used only while it belongs to this user
and no one else can enter it. ssh's shared connection keeps its control socket there
(``slurm/ssh.py``), and so does the command server (``cli/server.py``). Stdlib only, and not
even ``pathlib``: the command server's client reads it before anything else is imported.
"""

import os

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from collections.abc import Mapping

RUNTIME_DIR_ENV = "CLUSTERJOB_RUNTIME_DIR"  # envvars.RUNTIME_DIR; envvars imports dataclasses
SOCKET_PATH_MAX = 107  # sun_path is 108 bytes with its NUL on Linux


def runtime_dir(environ: "Mapping[str, str] | None" = None) -> str:
    """Where the sockets go, before it is created or checked."""
    env = os.environ if environ is None else environ
    given = env.get(RUNTIME_DIR_ENV)
    if given:
        return given
    xdg = env.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isdir(xdg):
        return os.path.join(xdg, "clusterjob")
    return f"/tmp/clusterjob-{os.getuid()}"


def private_runtime_dir(
    environ: "Mapping[str, str] | None" = None,
) -> tuple[str, str | None]:
    """The runtime directory, created 0700 where missing, and what is wrong with it (None
    when it is fit for sockets only this user may connect to)."""
    directory = runtime_dir(environ)
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)
        st = os.lstat(directory)
    except OSError as exc:
        return directory, f"cannot create {directory}: {exc.strerror or exc}"
    if st.st_uid != os.getuid() or st.st_mode & 0o077 or not os.path.isdir(directory):
        return directory, (
            f"{directory} must belong to you with mode 0700 (a directory); "
            f"set {RUNTIME_DIR_ENV} to a private directory"
        )
    return directory, None
