"""tests/python/test_openai.py - vspecd's HTTP endpoint driven by OpenAI's own Python SDK
(PyPI's openai, pinned in tools/install_deps.sh, which `make deps` installs into .venv), as
its users would: images.generate with a prompt by name, by number and in a sentence, an
unknown one (a 400 whose message lists the classes), n = 3, streamed generations
(partial images, and a client that leaves cancelling its job), the
errors in OpenAI's shape (400, 404, 429 with Retry-After), and models.list().

One vspecd for the module, on private ipc sockets and an HTTP port the kernel picks (read
from its log), serving the shipped model models/fmnist, its queue short (4) so that n = 10
slow jobs overflow it, with the tests' slow scheduler (tests/plugins/slowsched.c). Run by
`make python-check` (part of `make check`) under .venv/bin/python; it skips, saying so, only
where the openai package cannot be imported.
"""

import base64
import glob
import json
import os
import shutil
import signal
import struct
import subprocess
import tempfile
import time
import unittest
import urllib.request

try:
    import openai
except ImportError as e:  # pragma: no cover - the message is the point
    openai = None
    _IMPORT_ERROR = str(e)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, os.environ.get("VSPEC_BUILD") or "build")
START_TIMEOUT_S = 60  # a cold cache builds the preview colour table first
STOP_TIMEOUT_S = 10
SLOW = "sd:exact@slow:ms=300,depth=1"  # a job that lasts (tests/plugins/slowsched.c)
CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
           "Sneaker", "Bag", "Ankle boot"]


def png_size(data):
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG: %r" % data[:8]
    return struct.unpack(">II", data[16:24])


def setUpModule():
    if openai is None:
        raise unittest.SkipTest("the openai package cannot be imported (%s): `make deps` "
                                "installs it into .venv" % _IMPORT_ERROR)
    _Daemon.start()


def tearDownModule():
    _Daemon.stop()


class _Daemon:
    proc = None

    @classmethod
    def start(cls):
        cls.dir = tempfile.mkdtemp(prefix="vspec-openai-")
        plugins = os.path.join(cls.dir, "plugins")
        os.mkdir(plugins)
        for so in glob.glob(os.path.join(BUILD, "plugins", "*.so")):
            os.symlink(so, os.path.join(plugins, os.path.basename(so)))
        slow = os.path.join(plugins, "sched_slow.so")
        shutil.copyfile(os.path.join(BUILD, "tests", "plugins", "slowsched.so"), slow)
        os.chmod(slow, 0o644)  # vspecd refuses plugin files others can write
        cls.log = os.path.join(cls.dir, "vspecd.log")
        # the colour table cache tests/python/test_client.py keeps
        env = dict(os.environ, VSPEC_CACHE_DIR=os.path.join(BUILD, "python", "cache"))
        args = [os.path.join(BUILD, "vspecd"),
                "--endpoint", "ipc://%s/job.sock" % cls.dir,
                "--admin", "ipc://%s/admin.sock" % cls.dir, "--plugins", plugins,
                "--model", "fmnist=" + os.path.join(ROOT, "models", "fmnist"),
                "--model", "bare=" + bare_model(cls.dir),
                "--default-model", "fmnist", "--threads", "1", "--node", "openai-test",
                "--set", "defaults.auto_size=false", "--set", "queue.size=4",
                "--set", "http.listen=127.0.0.1:0"]
        with open(cls.log, "wb") as log:
            cls.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log, env=env)
        end = time.monotonic() + START_TIMEOUT_S
        cls.port = None
        while cls.port is None and time.monotonic() < end and cls.proc.poll() is None:
            with open(cls.log, errors="replace") as f:
                for line in f:
                    at = line.find("[http] listening on http://127.0.0.1:")
                    if at >= 0:
                        cls.port = int(line[at:].split(":")[2].split()[0])
            time.sleep(0.05)
        if cls.port is None:
            cls.stop()
            raise RuntimeError("vspecd gave no HTTP port:\n" + open(cls.log).read()[-3000:])
        cls.base = "http://127.0.0.1:%d/v1" % cls.port
        while time.monotonic() < end:  # ready once a model answers
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/health" % cls.port, timeout=2):
                    return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("vspecd's /health never answered 200")

    @classmethod
    def stop(cls):
        if cls.proc is None:
            return
        if cls.proc.poll() is None:
            cls.proc.send_signal(signal.SIGTERM)
            try:
                cls.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                cls.proc.kill()
                cls.proc.wait(5)
        rc, cls.proc = cls.proc.returncode, None
        with open(cls.log, errors="replace") as f:
            log = f.read()
        shutil.rmtree(cls.dir, ignore_errors=True)
        # a crash, or a sanitizer's report at exit (VSPEC_BUILD=build/asan), fails the module
        if rc != 0:
            raise RuntimeError("vspecd exited with %s:\n%s" % (rc, log[-4000:]))


def bare_model(parent):
    """models/fmnist without its draft GPT and EAGLE head, as a converted checkpoint comes."""
    src = os.path.join(ROOT, "models", "fmnist")
    with open(os.path.join(src, "vspec-model.json")) as f:
        manifest = json.load(f)
    del manifest["draft"], manifest["eagle"]
    manifest["name"] = "bare"
    d = os.path.join(parent, "bare")
    os.mkdir(d)
    for name in ("target.safetensors", "vq.safetensors"):
        os.symlink(os.path.join(src, name), os.path.join(d, name))
    for key in ("classifier", "fid_ref"):
        manifest.pop(key, None)
    with open(os.path.join(d, "vspec-model.json"), "w") as f:
        json.dump(manifest, f)
    return d


def client(**kw):
    return openai.OpenAI(base_url=_Daemon.base, api_key="none", timeout=30, **kw)


def idle(timeout_s=10):
    """Waits until no job is queued or running (the cancelled ones of a failed request)."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with urllib.request.urlopen("http://127.0.0.1:%d/health" % _Daemon.port) as r:
            h = json.load(r)
        if h["queued"] == 0 and h["running"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError("jobs still queued or running after %gs: %r" % (timeout_s, h))


class ImagesTest(unittest.TestCase):
    def generate(self, prompt, **kw):
        r = client().images.generate(model="fmnist", prompt=prompt, **kw)
        for d in r.data:
            self.assertEqual(png_size(base64.b64decode(d.b64_json)), (32, 32))
        return r

    def test_prompt_by_name(self):
        r = self.generate("sneaker")
        self.assertEqual(len(r.data), 1)
        self.assertEqual(r.data[0].revised_prompt, "Sneaker")
        self.assertEqual(r.data[0].vspec["class"], 7)

    def test_prompt_by_number(self):
        self.assertEqual(self.generate("9").data[0].revised_prompt, "Ankle boot")

    def test_prompt_in_a_sentence(self):
        r = self.generate("a photo of an ankle boot on a white background")
        self.assertEqual(r.data[0].revised_prompt, "Ankle boot")
        self.assertEqual(r.output_format, "png")
        self.assertEqual(r.usage.output_tokens, 64)  # an 8x8 token grid

    def test_unknown_prompt(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client().images.generate(model="fmnist", prompt="a red sports car")
        e = cm.exception
        self.assertEqual(e.status_code, 400)
        self.assertEqual(e.param, "prompt")
        self.assertEqual(e.code, "unknown_class")
        self.assertEqual(e.type, "invalid_request_error")
        for name in CLASSES:
            self.assertIn(name, e.message)

    def test_n_consecutive_seeds(self):
        r = self.generate("bag", n=3, extra_body={"seed": 41})
        self.assertEqual(len(r.data), 3)
        self.assertEqual([d.vspec["seed"] for d in r.data], ["41", "42", "43"])
        self.assertEqual(r.vspec["seeds"], ["41", "42", "43"])
        self.assertEqual({d.revised_prompt for d in r.data}, {"Bag"})
        # the same seed, the same image: the second of n = 3 is seed 42 alone
        one = self.generate("bag", extra_body={"seed": 42})
        self.assertEqual(one.data[0].b64_json, r.data[1].b64_json)

    def test_size(self):
        r = client().images.generate(model="fmnist", prompt="coat", size="1024x1024")
        self.assertEqual(png_size(base64.b64decode(r.data[0].b64_json)), (1024, 1024))
        with self.assertRaises(openai.BadRequestError) as cm:
            client().images.generate(model="fmnist", prompt="coat", size="1536x1024")
        self.assertEqual(cm.exception.param, "size")
        self.assertIn("32x32", cm.exception.message)

    def test_unknown_model(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client().images.generate(model="dall-e-3", prompt="sneaker")
        self.assertEqual(cm.exception.param, "model")

    def test_queue_full_is_429(self):
        with self.assertRaises(openai.RateLimitError) as cm:
            client(max_retries=0).images.generate(
                model="fmnist", prompt="sneaker", n=10, extra_body={"method": SLOW})
        e = cm.exception
        self.assertEqual(e.status_code, 429)
        self.assertEqual(e.code, "queue_full")
        self.assertGreaterEqual(int(e.response.headers["retry-after"]), 1)
        idle()  # the 5 accepted jobs were cancelled with it


def metric(series):
    with urllib.request.urlopen("http://127.0.0.1:%d/metrics" % _Daemon.port) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.split()[1])
    return None


class StreamTest(unittest.TestCase):
    def test_partial_images(self):
        events = list(client().images.generate(model="fmnist", prompt="a dress", stream=True,
                                               partial_images=2))
        self.assertEqual([e.type for e in events], ["image_generation.partial_image"] * 2
                         + ["image_generation.completed"])
        self.assertEqual([e.partial_image_index for e in events[:2]], [0, 1])
        for e in events:
            self.assertEqual(png_size(base64.b64decode(e.b64_json)), (32, 32))
        done = events[-1]
        self.assertEqual(done.usage.output_tokens, 64)
        self.assertEqual(done.revised_prompt, "Dress")
        # the previews fill in: each partial image differs from the next
        self.assertNotEqual(events[0].b64_json, events[1].b64_json)

    def test_no_partial_images(self):
        events = list(client().images.generate(model="fmnist", prompt="0", stream=True))
        self.assertEqual([e.type for e in events], ["image_generation.completed"])

    def test_refused_before_the_stream(self):
        with self.assertRaises(openai.BadRequestError) as cm:
            client().images.generate(model="fmnist", prompt="a red car", stream=True)
        self.assertEqual(cm.exception.code, "unknown_class")

    def test_disconnect_cancels(self):
        before = metric('vspec_jobs_total{state="cancelled"}')
        s = client().images.generate(model="fmnist", prompt="bag", stream=True,
                                     partial_images=1, extra_body={"method": SLOW})
        s.close()  # accepted (the 200 came), then gone
        idle(5)  # the slow job would run for seconds
        self.assertEqual(metric('vspec_jobs_total{state="cancelled"}'), before + 1)


class ModelsTest(unittest.TestCase):
    def test_jacobi_without_a_draft_model(self):
        # speculative decoding on a model with no drafter: Speculative Jacobi Decoding
        r = client().images.generate(
            model="bare", prompt="bag",
            extra_body={"method": "sd:exact@standard:drafter=jacobi,coupling=gumbel", "seed": 5})
        self.assertEqual(png_size(base64.b64decode(r.data[0].b64_json)), (32, 32))
        self.assertIn("drafter=jacobi", r.data[0].vspec["method"])
        with self.assertRaises(openai.BadRequestError) as cm:
            client().images.generate(model="bare", prompt="bag",
                                     extra_body={"method": "sd:exact@standard:depth=3"})
        self.assertIn("drafter=jacobi", cm.exception.message)

    def test_list(self):
        models = list(client().models.list())
        self.assertEqual([m.id for m in models], ["fmnist", "bare"])  # in the daemon's order
        m = models[0]
        self.assertEqual(m.object, "model")
        self.assertEqual(m.owned_by, "vspec")
        self.assertEqual([c["name"] for c in m.vspec["classes"]], CLASSES)
        self.assertEqual(m.vspec["size"], "32x32")
        self.assertEqual(m.vspec["default_method"], "ar")

    def test_retrieve(self):
        self.assertEqual(client().models.retrieve("fmnist").id, "fmnist")
        with self.assertRaises(openai.NotFoundError) as cm:
            client().models.retrieve("gpt-image-1")
        self.assertEqual(cm.exception.code, "model_not_found")


if __name__ == "__main__":
    unittest.main(verbosity=2)
