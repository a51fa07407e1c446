import unittest
from shop import client, worker

class ShopTest(unittest.TestCase):
    def test_client(self):
        self.assertEqual(client.request_options(), {"timeout": 20, "attempts": 3})

    def test_worker(self):
        self.assertEqual(worker.backoff_plan(), [20, 40, 80])
