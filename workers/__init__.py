"""Workers: getting an admitted job to a worker, and running, finishing and settling it there.

``dispatch/`` delivers jobs from the outbox (embedded, or Cloud Tasks) and
delivers push notifications; ``server`` is the private job endpoint (verify the
signed body, claim, run, renew, finish); ``isolation`` runs each job's runner in
a process of its own; ``finish`` and ``settlement`` record its outcome and settle
its reservation in one transaction, with the executor's usage the assembly wires
in; ``reconcile`` applies an operator's verdict on an unknown job;
``hosted_rlm/`` is the rlm executor. The claims, leases and fencing they rely on
are ``taskstate.claims``'s. ``assembly`` builds a worker from the settings.
See docs/WORKERS.md for the design and the state machine.
"""
