"""The GPUs of this machine as NVML reports them: one small interface over pynvml.

``inventory``: the plain data and ``read_inventory``, the one way to read it; ``nvml``: every
NVML call; ``isolation``: where a read runs so a hung driver cannot hold the caller;
``models``: which model an NVML device name is.
"""
