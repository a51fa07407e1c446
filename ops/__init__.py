"""The composition root: the `specialists` operator command wires the rooms together."""
