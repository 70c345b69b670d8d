"""Applying rendered artifacts: a local process (`local`) or a Kubernetes cluster (`kubernetes`)."""
