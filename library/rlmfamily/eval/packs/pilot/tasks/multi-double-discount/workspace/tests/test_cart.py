import unittest
from store.cart import cart_total, line_total

class CartTest(unittest.TestCase):
    def test_line(self):
        self.assertEqual(line_total(2, 1000, 10), 1800)

    def test_cart_applies_the_discount_once(self):
        self.assertEqual(cart_total([(2, 1000), (1, 500)], 10), 2250)
