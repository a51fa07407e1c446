import unittest
from roman import to_roman

class RomanTest(unittest.TestCase):
    def test_values(self):
        for n, text in [(1, "I"), (4, "IV"), (9, "IX"), (14, "XIV"), (40, "XL"), (1994, "MCMXCIV"), (3999, "MMMCMXCIX")]:
            self.assertEqual(to_roman(n), text)

    def test_range(self):
        for n in (0, 4000, -3):
            with self.assertRaises(ValueError):
                to_roman(n)
