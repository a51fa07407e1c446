import unittest
from tool.formats import FORMATS
from tool.report import render

ROWS = [{"name": "ann", "n": 2}, {"name": "bob", "n": 5}]

class ReportTest(unittest.TestCase):
    def test_text_unchanged(self):
        self.assertEqual(render(ROWS, ["name", "n"]), "name | n\nann | 2\nbob | 5")

    def test_csv(self):
        self.assertIn("csv", FORMATS)
        self.assertEqual(render(ROWS, ["name", "n"], format="csv"), "name,n\nann,2\nbob,5")

    def test_unknown(self):
        with self.assertRaises(ValueError):
            render(ROWS, ["name"], format="xml")
