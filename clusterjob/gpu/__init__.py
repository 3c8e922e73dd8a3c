"""The GPUs of this machine as NVML reports them: one small interface over pynvml."""
