import unittest
from intervals import merge

class MergeTest(unittest.TestCase):
    def test_overlaps(self):
        self.assertEqual(merge([[5, 7], [1, 3], [2, 4]]), [[1, 4], [5, 7]])

    def test_touching_and_empty(self):
        self.assertEqual(merge([[1, 2], [2, 3]]), [[1, 3]])
        self.assertEqual(merge([]), [])
