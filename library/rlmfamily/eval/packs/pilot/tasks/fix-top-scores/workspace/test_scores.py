import unittest
from scores import top_scores

class TopScoresTest(unittest.TestCase):
    def test_best_first(self):
        players = [("ann", 3), ("bob", 9), ("cy", 5)]
        self.assertEqual(top_scores(players, 2), [("bob", 9), ("cy", 5)])

    def test_ties_keep_input_order(self):
        players = [("zed", 4), ("amy", 4), ("max", 1)]
        self.assertEqual(top_scores(players, 2), [("zed", 4), ("amy", 4)])
