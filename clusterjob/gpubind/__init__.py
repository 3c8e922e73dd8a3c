"""GPU binding where the scheduler counts GPUs but names none (Grid Engine 8.1: no RSMAP).

The root prolog (or, where none is installed, the job's first step) picks the job's GPUs on
the host by model with the workstation claims, writes them where the job reads them, and
runs the node-map preflight on them; the epilog (or the job's end) frees them. It stands
above ``node`` (the preflight) and ``workstation`` (the claims), which are independent.
"""
