"""Live jobs: submit, status, logs, cancel, resubmit, the local registry, availability."""
