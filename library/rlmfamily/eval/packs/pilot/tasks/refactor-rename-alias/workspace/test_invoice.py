import unittest
import warnings
import invoice

class InvoiceTest(unittest.TestCase):
    def test_new_name(self):
        self.assertEqual(invoice.compute_invoice_total([(2, 10.0), (1, 5.5)], 0.2), 30.6)

    def test_alias_warns(self):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertEqual(invoice.calc([(1, 10.0)], 0.0), 10.0)
        self.assertTrue(any(issubclass(w.category, DeprecationWarning) for w in caught))
