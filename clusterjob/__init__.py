"""clusterjob: GPU jobs on the right GPUs of a Slurm cluster, proven before training starts."""

__version__ = "0.1.0"
