"""Completion gates: commands run against the final workspace that decide whether a run is accepted.

- ``spec.py``: what a gate is (``GateSpec``: name, command, deadline) and the verdicts a run ends with;
- ``runner.py``: ``GateKeeper`` runs a run's gates as command jobs (surface ``gate``) through the run's
  ``CommandBroker``, tells the model what failed, and judges the run (``verdict_of``).
"""
