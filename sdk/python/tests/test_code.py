import unittest

import _path  # noqa: F401  (puts the package on sys.path)

import airlock
from fake_server import KEY, FakeServer


class CodeTests(unittest.TestCase):
    def setUp(self):
        self.srv = FakeServer().__enter__()
        self.client = airlock.Client(self.srv.url + "/", KEY, timeout=10)
        self.sb = self.client.create()

    def tearDown(self):
        self.srv.__exit__(None, None, None)

    def test_state_result_error_and_image(self):
        self.assertIsNone(self.sb.run_code("x = 21").main)
        ex = self.sb.run_code("x * 2")
        self.assertEqual(ex.text, "42")
        self.assertEqual(ex.context, "default-python")
        ex = self.sb.run_code("1/0")
        self.assertEqual(ex.error.name, "ZeroDivisionError")
        self.assertTrue(ex.error.traceback)
        ex = self.sb.run_code("plot()")
        self.assertEqual(len(ex.results), 1)
        self.assertTrue(ex.results[0]["image/png"].startswith(b"\x89PNG"))
        self.assertEqual(ex.results[0]["text/plain"], "<Figure>")
        seen = []
        ex = self.sb.run_code("hello", on_stdout=seen.append)
        self.assertEqual(seen, [b"hello\n"])

    def test_results_are_marked(self):
        ex = self.sb.run_code("x = 21")
        ex = self.sb.run_code("x * 2")
        self.assertIsInstance(ex.main, airlock.Result)
        self.assertEqual(ex.main, {"text/plain": "42"})  # still a plain MIME bundle
        self.assertEqual((ex.main.main, ex.main.file), (True, None))
        self.assertEqual(ex.files, {})
        ex = self.sb.run_code("plot()")
        self.assertEqual((ex.results[0].main, ex.results[0].file), (False, None))

    def test_text_types_stay_text(self):
        # The API sends text/*, image/svg+xml, application/json,
        # application/javascript, *+json and *+xml as strings, others base64.
        ex = self.sb.run_code("js()")
        self.assertEqual(ex.results, [{"application/javascript": "var x = 1;", "text/plain": "<JS>"}])

    def test_stream_broken_says_why(self):
        with self.assertRaises(airlock.StreamBroken) as cm:
            self.sb.run_code("die()")
        self.assertIn("the sandbox stopped", str(cm.exception))
        self.assertIn("stream ended before the end record", str(cm.exception))

    def test_return_files(self):
        ex = self.sb.run_code("savefig('plot.png')")  # not asked for: not sent
        self.assertNotIn("return_files", self.srv.last()["json"])
        self.assertEqual(ex.results, [])
        seen = []
        ex = self.sb.run_code("savefig('out/plot.png')", return_files=["*.svg", "out/*.png"], on_result=seen.append)
        self.assertEqual(self.srv.last()["json"]["return_files"], ["*.svg", "out/*.png"])
        self.assertEqual(len(ex.results), 1)
        r = ex.results[0]
        self.assertEqual((r.file, r.main), ("out/plot.png", False))
        self.assertTrue(r["image/png"].startswith(b"\x89PNG"))
        self.assertIsNone(ex.main)
        self.assertEqual(ex.files, {"out/plot.png": r})
        self.assertEqual([x.file for x in seen], ["out/plot.png"])
        # One pattern may be given as a string.
        ex = self.sb.run_code("savefig('b.png')", return_files="*.png")
        self.assertEqual(self.srv.last()["json"]["return_files"], ["*.png"])
        self.assertEqual(list(ex.files), ["b.png"])

    def test_status(self):
        seen = []
        ex = self.sb.run_code("x = 1", language="bash", on_status=seen.append)
        self.assertEqual(seen, ["starting bash context"])
        self.assertEqual(ex.status, ["starting bash context"])
        ex = self.sb.run_code("x = 1", language="bash", on_status=seen.append)  # already started
        self.assertEqual((seen, ex.status), (["starting bash context"], []))
        # Without a callback the lines are still kept, and never mixed into the output.
        ex = self.sb.run_code("hi", context="fresh")
        self.assertEqual((ex.status, ex.stdout), (["starting python context"], b"hi\n"))

    def test_contexts(self):
        c = self.sb.create_context(id="mine")
        self.assertEqual(c["id"], "mine")
        self.sb.run_code("y = 2", context="mine")
        self.assertEqual(self.sb.run_code("y * 5", context="mine").text, "10")
        self.assertIn("mine", [c["id"] for c in self.sb.list_contexts()])
        self.sb.interrupt_context("mine")
        self.sb.restart_context("mine")
        ex = self.sb.run_code("y * 5", context="mine")  # restart cleared the state
        self.assertEqual(ex.error.name, "NameError")
        self.sb.delete_context("mine")
        with self.assertRaises(airlock.NotFound):
            self.sb.delete_context("mine")


if __name__ == "__main__":
    unittest.main()
