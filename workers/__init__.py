"""Workers: dispatch of admitted jobs, the private worker endpoint, claims, leases and fencing.

See docs/WORKERS.md for the design and the state machine.
"""
