"""Hosted RLM specialists on a worker (issue 7).

The runner turns a claimed job's A2A message into an RLM session over an evidence
bundle, runs it in Monty under the spec's limits with the hosted profile (no
children, no A2A, no shell, no writes), journals every model call and step in
PostgreSQL with signed Monty checkpoints so that a replacement worker resumes a
job instead of losing it, and returns the answer as artifacts with the amount to
settle. Modules:

- ``routes``: operator-configured model routes (OpenAI-compatible or scripted) and
  the readiness check.
- ``bundle``: the A2A message as the specialist's task and evidence bundle.
- ``store``: the PostgreSQL ``CheckpointStore`` (fenced by the claim).
- ``journal``: model calls, steps and the run's record; what a resume starts from; what the finish reads.
- ``hosted``: the hosted profile around ``rlm.Session`` (settings, kernel, provider).
- ``answer``: the answer as a report and findings; the output limit.
- ``runner``: ``SpecialistRunner``, the worker's ``Runner`` for executor ``rlm``.
- ``service``: which specs a worker serves, and the readiness report.
- ``a2a``: the run's artifacts and the task's final metadata as A2A events.

"""
