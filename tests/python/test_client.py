"""tests/python/test_client.py - the Python client (clients/python) against a real vspecd,
and its typed events of messages built here (EventsTest, no daemon).

One vspecd for the class, on private ipc sockets in a temporary directory, serving the
shipped model models/fmnist with the project's plugins and the tests' slow scheduler
(tests/plugins/slowsched.c, for a job that lasts long enough to cancel). Run by
`make python-check` (part of `make check`), which generates the protobuf module into
$(BUILD)/python and puts it on PYTHONPATH; VSPEC_BUILD names the build directory.

The model's preview colour table (8.8 s to build on the development CPU) is cached in
$(BUILD)/python/cache, which belongs to this test: a daemon with an empty cache would spend
most of the test's budget on it at every run.
"""

import glob
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest

import vspec

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("VSPEC_BUILD") or "build")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
START_TIMEOUT_S = 60  # a cold cache builds the colour table first
STOP_TIMEOUT_S = 10


def png_size(data):
    """(width, height) from a PNG's IHDR chunk."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG: %r" % data[:8]
    assert data[12:16] == b"IHDR", "no IHDR first: %r" % data[12:16]
    return struct.unpack(">II", data[16:24])


class _Daemon(unittest.TestCase):
    """A vspecd for the test class (no tests of its own); daemon_args() adds options."""

    @classmethod
    def daemon_args(cls):
        return []

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="vspec-py-")
        plugins = os.path.join(cls.dir, "plugins")
        os.mkdir(plugins)
        for so in glob.glob(os.path.join(BUILD, "plugins", "*.so")):
            os.symlink(so, os.path.join(plugins, os.path.basename(so)))
        # vspecd refuses plugin files others can write, whatever the umask made of the copy
        slow = os.path.join(plugins, "sched_slow.so")
        shutil.copyfile(os.path.join(BUILD, "tests", "plugins", "slowsched.so"), slow)
        os.chmod(slow, 0o644)
        cls.job_ep = "ipc://%s/job.sock" % cls.dir
        cls.admin_ep = "ipc://%s/admin.sock" % cls.dir
        cls.log = os.path.join(cls.dir, "vspecd.log")
        env = dict(os.environ, VSPEC_CACHE_DIR=os.path.join(BUILD, "python", "cache"))
        args = [os.path.join(BUILD, "vspecd"), "--endpoint", cls.job_ep, "--admin", cls.admin_ep,
                "--plugins", plugins, "--model", "fmnist=" + os.path.join(ROOT, "models", "fmnist"),
                "--default-model", "fmnist", "--threads", "1", "--node", "pytest",
                "--log-level", "debug",
                # a speculative method without a size runs on the plugin's default size, not
                # size=auto: tuning it (seconds) is tests/test_autotune.c's subject
                "--set", "defaults.auto_size=false"] + cls.daemon_args()
        with open(cls.log, "wb") as log:
            cls.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        try:
            cls._wait_ready()
        except BaseException:
            cls._stop()
            raise

    @classmethod
    def _wait_ready(cls):
        end = time.monotonic() + START_TIMEOUT_S
        while True:
            if cls.proc.poll() is not None:
                raise RuntimeError("vspecd exited with %s:\n%s" % (cls.proc.returncode,
                                                                   cls._log_tail()))
            try:
                with vspec.Client(cls.admin_ep, timeout=0.5) as c:
                    if c.ping() == "pytest":
                        return
            except vspec.VspecError:
                pass
            if time.monotonic() > end:
                raise RuntimeError("vspecd did not answer within %d s:\n%s"
                                   % (START_TIMEOUT_S, cls._log_tail()))
            time.sleep(0.1)

    @classmethod
    def _log_tail(cls):
        with open(cls.log, "r", errors="replace") as f:
            return "".join(f.readlines()[-30:])

    @classmethod
    def _stop(cls):
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGTERM)
            try:
                cls.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                cls.proc.kill()
                cls.proc.wait(STOP_TIMEOUT_S)
        if not os.environ.get("VSPEC_TEST_KEEP"):
            shutil.rmtree(cls.dir, ignore_errors=True)

    @classmethod
    def tearDownClass(cls):
        rc_before = cls.proc.poll()
        cls._stop()
        # the daemon must have lived through every test and drained cleanly
        if rc_before is not None or cls.proc.returncode != 0:
            raise AssertionError("vspecd ended with %s (before the stop: %s)"
                                 % (cls.proc.returncode, rc_before))


class DaemonTest(_Daemon):
    def setUp(self):
        self.client = vspec.Client(self.job_ep, timeout=10)

    def tearDown(self):
        self.client.close()

    def test_generate(self):
        r = self.client.generate(class_label=3, method="sd:lantern:delta=0.2", seed=1)
        self.assertEqual(png_size(r.png), (32, 32))
        self.assertEqual((r.width, r.height, r.grid_h, r.grid_w), (32, 32, 8, 8))
        self.assertGreater(r.job_id, 0)
        s = r.stats
        self.assertEqual(s.seed, 1)
        self.assertEqual(s.tokens, 64)
        self.assertEqual(len(r.tokens), 64)
        # speculative decoding: fewer target forwards than tokens, TPF consistent with them
        self.assertLess(s.target_forwards, 64)
        self.assertAlmostEqual(s.tpf, s.tokens / s.target_forwards, places=3)
        self.assertGreaterEqual(s.mal, 1.0)
        self.assertTrue(0.0 < s.accept_rate <= 1.0, s.accept_rate)
        self.assertGreater(s.generate_s, 0.0)
        self.assertIn("seed=1", r.describe)

    def test_prompt(self):
        # the daemon matches the words to a class (core/class_prompt.c), as for the CLI's
        # --prompt and the HTTP endpoint's prompt; Accepted and the Result say which
        r = self.client.generate(prompt="a photo of two sneakers", method="ar", seed=1)
        self.assertEqual((r.class_label, r.class_name), (7, "Sneaker"))
        self.assertIn("class=7", r.describe)
        with self.client.stream(prompt="9", method="ar", seed=1) as job:
            accepted = next(iter(job))
            self.assertIsInstance(accepted, vspec.Accepted)
            self.assertEqual((accepted.class_label, accepted.class_name), (9, "Ankle boot"))
            job.wait()
        with self.assertRaises(vspec.VspecError) as cm:
            self.client.generate(prompt="a red car", method="ar")
        self.assertEqual(cm.exception.code, "invalid")
        self.assertIn("0 T-shirt/top", cm.exception.message)
        with self.assertRaises(ValueError):
            self.client.generate(class_label=1, prompt="bag")

    def test_stream(self):
        with self.client.stream(class_label=1, method="ar", seed=2, preview="lut",
                                preview_every_tokens=16) as job:
            events = list(job)
        kinds = [type(e).__name__ for e in events]
        self.assertEqual(kinds[0], "Accepted", kinds)
        self.assertEqual(kinds[-1], "Done", kinds)
        self.assertNotIn("Failed", kinds)
        self.assertIn("Progress", kinds)
        self.assertIn("Preview", kinds)
        first_preview = kinds.index("Preview")
        self.assertIn("Progress", kinds[:first_preview], "a preview before any progress")
        self.assertEqual([e.seq for e in events], list(range(len(events))))
        self.assertEqual({e.job_id for e in events}, {job.job_id})
        acc = events[0]
        self.assertEqual((acc.model, acc.method, acc.tokens_total, acc.seed), ("fmnist", "ar", 64, 2))
        done = [e.tokens_done for e in events if isinstance(e, vspec.Progress) and e.round >= 0]
        self.assertEqual(done, sorted(done))
        self.assertEqual(done[-1], 64)
        for p in (e for e in events if isinstance(e, vspec.Preview)):
            self.assertEqual(p.kind, "lut")
            self.assertEqual(png_size(p.png), (p.width, p.height))
            self.assertLess(p.tokens_done, 64)
        # the progress deltas, applied in order, give the result's token grid
        grid = [None] * 64
        for p in (e for e in events if isinstance(e, vspec.Progress)):
            for pos, tok in zip(p.positions, p.tokens):
                grid[pos] = tok
        self.assertEqual(grid, job.result.tokens)
        self.assertEqual(png_size(job.result.png), (32, 32))

    def test_cancel(self):
        # the slow scheduler sleeps 300 ms per round: about 10 s for the whole image
        job = self.client.stream(class_label=0, method="sd:exact@slow:ms=300", seed=3)
        accepted = next(job)
        self.assertIsInstance(accepted, vspec.Accepted)
        t0 = time.monotonic()
        self.client.cancel(job.job_id)
        rest = list(job)
        self.assertLess(time.monotonic() - t0, 3.0)
        self.assertIsInstance(rest[-1], vspec.Failed, rest)
        self.assertEqual(rest[-1].error.code, "cancelled")
        self.assertEqual(rest[-1].error.job_id, job.job_id)
        with self.assertRaises(vspec.VspecError) as cm:
            job.wait()
        self.assertEqual(cm.exception.code, "cancelled")
        # a job that is over (or never was) cannot be cancelled
        with self.assertRaises(vspec.VspecError) as cm:
            self.client.cancel(job.job_id)
        self.assertEqual(cm.exception.code, "not-found")
        self.assertIn(str(job.job_id), cm.exception.message)

    def test_two_jobs_on_one_client(self):
        # the second job's events are taken first: the first one's wait in its inbox
        first = self.client.stream(class_label=2, method="ar", seed=5)
        second = self.client.stream(class_label=4, method="ar", seed=6)
        r2, r1 = second.wait(), first.wait()
        self.assertNotEqual(r1.job_id, r2.job_id)
        self.assertEqual((r1.seed, r2.seed), (5, 6))
        self.assertEqual(png_size(r1.png), (32, 32))
        # the same seed gives the same image
        self.assertEqual(r1.png, self.client.generate(class_label=2, method="ar", seed=5).png)

    def test_status(self):
        self.client.generate(class_label=5, method="ar", seed=4)
        st = self.client.status()
        self.assertEqual(st["node"], "pytest")
        self.assertEqual(st["default_model"], "fmnist")
        model = [m for m in st["models"] if m["name"] == "fmnist"]
        self.assertEqual(len(model), 1, st["models"])
        self.assertEqual((model[0]["grid_h"], model[0]["grid_w"], model[0]["num_classes"]),
                         (8, 8, 10))
        self.assertGreaterEqual(st["totals"]["completed"], 1)
        self.assertIsInstance(st["totals"]["submitted"], int)
        # the job endpoint: this client's own jobs (none running now) and no paths
        self.assertTrue(st["own_jobs_only"])
        self.assertEqual(st.get("workers", []), [])
        self.assertNotIn("dir", model[0])
        names = {(p["kind"], p["name"]) for p in st["plugins"]}
        self.assertIn(("backend", "llamagen"), names)
        # the admin endpoint answers with every worker and the model directories
        with vspec.Client(self.admin_ep, timeout=10) as admin:
            ast = admin.status()
            self.assertEqual(ast["node"], "pytest")
            self.assertEqual(len(ast["workers"]), 1)
            self.assertIn("dir", [m for m in ast["models"] if m["name"] == "fmnist"][0])

    def test_errors(self):
        with self.assertRaises(vspec.VspecError) as cm:
            self.client.generate(class_label=1, method="sd:nosuchrule")
        self.assertEqual(cm.exception.code, "invalid")
        self.assertIn("nosuchrule", cm.exception.message)
        with self.assertRaises(vspec.VspecError) as cm:
            self.client.generate(class_label=10, method="ar")
        self.assertEqual(cm.exception.code, "invalid")
        self.assertIn("class_label", cm.exception.message)
        with self.assertRaises(TypeError):
            self.client.generate(class_label=1, tempreature=0.5)
        with self.assertRaises(ValueError):
            self.client.generate(class_label=1, method="ar", accept="lantern")
        # the connection still works after refusals
        self.assertEqual(self.client.ping(), "pytest")

    def test_unreachable_fails_fast(self):
        for ep in ("ipc://%s/nobody.sock" % self.dir, "tcp://127.0.0.1:1"):
            t0 = time.monotonic()
            with self.assertRaises(vspec.VspecUnreachable) as cm:
                vspec.Client(ep, timeout=30)
            self.assertLess(time.monotonic() - t0, 2.5)
            self.assertIn(ep, str(cm.exception))


class CurveTest(_Daemon):
    """CURVE on the job endpoint: keys from `vspec keygen`, one client on the allow-list."""

    @classmethod
    def daemon_args(cls):
        for name in ("server", "alice", "mallory"):
            subprocess.run([os.path.join(BUILD, "vspec"), "keygen", os.path.join(cls.dir, name)],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           timeout=10)
        allow = os.path.join(cls.dir, "clients.allow")
        with open(allow, "w") as f:
            f.write(vspec.keys.read_key(os.path.join(cls.dir, "alice.pub"), "public") + " alice\n")
        return ["--set", "curve.enabled=true",
                "--set", "curve.secret_key_file=" + os.path.join(cls.dir, "server.key"),
                "--set", "curve.allowed_clients=" + allow]

    def test_allowed_and_refused_keys(self):
        server = os.path.join(self.dir, "server.pub")
        with vspec.Client(self.job_ep, server_key=server, client_keys=os.path.join(
                self.dir, "alice.key"), timeout=10) as c:
            self.assertEqual(png_size(c.generate(class_label=1, method="ar", seed=1).png), (32, 32))
        with vspec.Client(self.job_ep, server_key=server, client_keys=os.path.join(
                self.dir, "mallory.key"), timeout=1) as c:
            with self.assertRaises(vspec.VspecTimeout) as cm:
                c.ping()
            self.assertIn("refused this client's CURVE key", str(cm.exception))
        with self.assertRaises(ValueError):  # a server key without a client key
            vspec.Client(self.job_ep, server_key=server)


class EventsTest(unittest.TestCase):
    """The typed events of messages built here (no daemon): Phase, Notice, Result.notes."""

    @staticmethod
    def _message(fill):
        from vspec import vspec_pb2 as pb
        from vspec.wire import Message
        ev = pb.Event(version=pb.PROTOCOL_V1, job_id=9, seq=3)
        fill(ev)
        return Message(ev, {})

    def test_phase(self):
        def fill(ev):
            ev.phase.name = "tuning"
            ev.phase.message = "size=auto: tuning sd:exact (3 of 9)"
            ev.phase.done = 0.4
        e = vspec.events.from_message(self._message(fill), 0.0)
        self.assertIsInstance(e, vspec.Phase)
        self.assertEqual((e.job_id, e.seq, e.name, e.done, e.eta_s), (9, 3, "tuning", 0.4, None))
        self.assertEqual(e.message, "size=auto: tuning sd:exact (3 of 9)")

    def test_notice(self):
        def fill(ev):
            ev.notice.kind = "autotune"
            ev.notice.message = "size=auto: chose depth=3"
        e = vspec.events.from_message(self._message(fill), 0.0)
        self.assertIsInstance(e, vspec.Notice)
        self.assertEqual((e.kind, e.message), ("autotune", "size=auto: chose depth=3"))

    def test_result_notes(self):
        def fill(ev):
            ev.result.seed = 5
            ev.result.notes.extend(["size=auto: chose depth=3", "runs as AR"])
        e = vspec.events.from_message(self._message(fill), 0.0)
        self.assertIsInstance(e, vspec.Done)
        self.assertEqual(e.result.notes, ["size=auto: chose depth=3", "runs as AR"])
        self.assertEqual(e.result.seed, 5)


if __name__ == "__main__":
    unittest.main(verbosity=2)
