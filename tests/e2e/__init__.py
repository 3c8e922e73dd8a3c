"""End-to-end tests on the real local Slurm sandbox (marker `slurm`)."""
