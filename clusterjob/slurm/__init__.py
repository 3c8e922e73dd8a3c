"""Slurm through its commands: ``runner`` runs them, ``parse`` reads them, ``commands`` types
them (``SlurmClient``). Nothing else in clusterjob starts a Slurm command."""

from __future__ import annotations
