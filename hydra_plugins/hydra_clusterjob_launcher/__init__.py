"""A Hydra launcher that submits a ``--multirun`` sweep to Slurm through clusterjob, as ONE
array job, and returns at once (``hydra.launcher.wait=false``, the default) or waits for the
tasks' return values (``wait=true``).

Hydra finds it by scanning the ``hydra_plugins`` namespace package (this directory has no
``__init__.py`` above it, on purpose); ``hydra/launcher=clusterjob`` selects it. The config
is ``config.ClusterjobLauncherConf``, the launcher ``launcher.ClusterjobLauncher``.
"""
