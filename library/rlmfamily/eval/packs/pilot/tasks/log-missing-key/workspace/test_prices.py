import unittest
from prices import format_price

class FormatTest(unittest.TestCase):
    def test_given_currency(self):
        self.assertEqual(format_price({"amount": 3, "currency": "USD"}), "$3.00")

    def test_default_currency(self):
        self.assertEqual(format_price({"amount": 4.2}), "€4.20")
