import unittest
from csvline import split_line

class SplitTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(split_line("a,b,c"), ["a", "b", "c"])

    def test_quoted(self):
        self.assertEqual(split_line('1,"Smith, Ann","say ""hi"""'), ["1", "Smith, Ann", 'say "hi"'])
