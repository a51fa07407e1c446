import unittest

from tally import stats


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(stats.mean([1, 2, 3, 6]), 3)

    def test_median_of_an_odd_count(self):
        self.assertEqual(stats.median([5, 1, 3]), 3)

    def test_median_of_an_even_count_is_the_mean_of_the_middle_two(self):
        self.assertEqual(stats.median([4, 1, 3, 2]), 2.5)


if __name__ == "__main__":
    unittest.main()
