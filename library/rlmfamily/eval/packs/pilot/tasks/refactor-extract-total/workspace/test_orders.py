import unittest
import orders

ORDERS = [{"lines": [{"qty": 2, "unit_price": 5}], "discount": 1},
          {"lines": [{"qty": 1, "unit_price": 20}, {"qty": 3, "unit_price": 1}]}]

class OrdersTest(unittest.TestCase):
    def test_summary_unchanged(self):
        self.assertEqual(orders.summarize(ORDERS), {"revenue": 32, "largest": 23})
        self.assertEqual(orders.summarize([]), {"revenue": 0, "largest": 0})

    def test_order_total_is_extracted(self):
        self.assertEqual(orders.order_total(ORDERS[0]), 9)
        calls = []
        real = orders.order_total
        orders.order_total = lambda order: calls.append(order) or real(order)
        try:
            orders.summarize(ORDERS)
        finally:
            orders.order_total = real
        self.assertEqual(len(calls), 2, "summarize() computes each order's total with order_total()")
