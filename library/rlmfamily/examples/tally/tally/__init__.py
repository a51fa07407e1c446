"""tally: small statistics over lists of numbers."""
