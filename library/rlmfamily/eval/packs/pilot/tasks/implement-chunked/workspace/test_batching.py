import unittest
from batching import chunked

class ChunkedTest(unittest.TestCase):
    def test_even_and_rest(self):
        self.assertEqual(chunked(range(5), 2), [[0, 1], [2, 3], [4]])
        self.assertEqual(chunked([], 3), [])

    def test_size(self):
        with self.assertRaises(ValueError):
            chunked([1], 0)
