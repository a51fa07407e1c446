import unittest
from tags import add_tag

class AddTagTest(unittest.TestCase):
    def test_calls_do_not_share_a_list(self):
        self.assertEqual(add_tag("a"), ["a"])
        self.assertEqual(add_tag("b"), ["b"])

    def test_given_list_is_extended(self):
        tags = ["x"]
        self.assertIs(add_tag("y", tags), tags)
        self.assertEqual(tags, ["x", "y"])
