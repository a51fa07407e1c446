import unittest
from calendar_rules import is_leap

class LeapTest(unittest.TestCase):
    def test_ordinary(self):
        self.assertTrue(is_leap(2024))
        self.assertFalse(is_leap(2023))

    def test_centuries(self):
        self.assertFalse(is_leap(1900))
        self.assertTrue(is_leap(2000))
        self.assertFalse(is_leap(2100))
