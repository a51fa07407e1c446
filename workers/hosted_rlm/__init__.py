"""Hosted RLM specialists on a worker: the rlm executor (issue 7).

The runner turns a claimed job's A2A message into an RLM session over an evidence
bundle, runs it in Monty under the spec's limits with the hosted profile (no
children, no A2A, no shell, no writes), journals every model call and step in
PostgreSQL with signed Monty checkpoints so that a replacement worker resumes a
job instead of losing it, and returns the answer as artifacts. Modules:

- ``settings``: this executor's section of the settings (``settings.hosted``).
- ``routes``: operator-configured model routes (OpenAI-compatible or scripted) and
  the readiness check.
- ``bundle``: the A2A message as the specialist's task and evidence bundle;
  ``pasted``: code pasted into the message's text, read as a bundle.
- ``store``: the PostgreSQL ``CheckpointStore`` (fenced by the claim).
- ``journal``: model calls, steps and the run's record; what a resume starts from.
- ``usage``: the run's record as the finish's settlement reads it (the executor's
  ``workers.settlement.UsageSource``, wired in by ``workers.assembly``).
- ``hosted``: the hosted profile around ``rlm.Session`` (settings, kernel, provider).
- ``answer``: the answer as a report and findings; the output limit.
- ``runner``: the worker's ``Runner`` for executor ``rlm``.
- ``serving``: which specs a worker serves, and the readiness report.
- ``a2a``: the run's artifacts and the task's final metadata as A2A events.
"""
