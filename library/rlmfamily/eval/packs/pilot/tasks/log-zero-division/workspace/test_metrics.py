import unittest
from metrics import average_latency

class AverageTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(average_latency([10, 20, 30]), 20)

    def test_empty_window(self):
        self.assertEqual(average_latency([]), 0.0)
