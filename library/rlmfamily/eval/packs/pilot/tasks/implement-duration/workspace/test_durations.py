import unittest
from durations import parse_duration

class DurationTest(unittest.TestCase):
    def test_values(self):
        self.assertEqual(parse_duration("1h30m"), 5400)
        self.assertEqual(parse_duration("45s"), 45)
        self.assertEqual(parse_duration("2h5s"), 7205)

    def test_refused(self):
        for text in ("", "5", "30m1h", "1x", "1h1h"):
            with self.assertRaises(ValueError):
                parse_duration(text)
