"""Execution kernels of the RLM library: where the model's code runs.

``base`` (the seam: KernelLimits, StepResult, Kernel), ``host`` (the user's own
Python in a child process; guardrails, not a security boundary), ``monty`` (the
pydantic-monty sandbox) and ``checkpoints`` (Monty checkpoints and their store).
Import the kernel you need from its module; this package imports nothing heavy.
"""
