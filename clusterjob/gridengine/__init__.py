"""Grid Engine (Son of Grid Engine 8.1.x): the one package that runs its commands and reads
their output. It stands beside ``clusterjob.slurm``, on the same floor."""
