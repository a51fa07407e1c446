"""The runbook's three rules, against the day of events in fixtures/deployments.jsonl."""

import unittest
from pathlib import Path

from release_health.events import load_events
from release_health.report import release_health

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "deployments.jsonl"


def rows_of(service):
    return [row for row in release_health(load_events(FIXTURE)) if row.service == service]


class ReleaseHealthTest(unittest.TestCase):
    def test_an_older_success_does_not_hide_a_newer_failure(self):
        # payments 42.0.0 failed at 10:03; the 41.2.0 success (09:02) arrived after it in the file.
        payments = [(row.status, row.version, row.event_id) for row in rows_of("payments")]
        self.assertEqual(payments, [("failing", "42.0.0", "dep-1004")])

    def test_a_duplicated_event_makes_one_row_per_service(self):
        services = [row.service for row in release_health(load_events(FIXTURE))]
        self.assertEqual(services, ["accounts", "checkout", "payments", "search"])

    def test_a_successful_deployment_over_300_seconds_is_slow(self):
        slow = {row.service: row.slow for row in release_health(load_events(FIXTURE))}
        # search took 412 s; accounts exactly 300 s (not over); payments failed (never slow).
        self.assertEqual(slow, {"accounts": False, "checkout": False, "payments": False, "search": True})


if __name__ == "__main__":
    unittest.main()
