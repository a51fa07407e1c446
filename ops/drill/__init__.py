"""`specialists drill` and what it builds on: the local topology, the scenarios, the end-state audit."""

# The scenarios in the order a drill runs them (``scenarios.SCENARIOS`` holds the functions); here so that
# building the command's parser imports nothing heavy.
SCENARIO_NAMES = ("refusal", "cancellation", "cross-instance", "restart-and-rollout", "retained-unknown", "push",
                  "settlement")
