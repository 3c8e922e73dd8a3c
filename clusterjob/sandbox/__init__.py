"""A local Slurm cluster with stand-in GPUs, for trying clusterjob and for its end-to-end tests."""
