import unittest
from slug import slugify

class SlugifyTest(unittest.TestCase):
    def test_example(self):
        self.assertEqual(slugify("Hello, World!"), "hello-world")

    def test_runs_and_ends(self):
        self.assertEqual(slugify("  --Rust & Go: 2026 --"), "rust-go-2026")

    def test_non_ascii_is_a_separator(self):
        self.assertEqual(slugify("café crème"), "caf-cr-me")
