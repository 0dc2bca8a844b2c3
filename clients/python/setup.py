"""Build step of the vspec Python package: vspec/vspec_pb2.py from proto/vspec.proto.

The generated module is made by the protoc of the machine that builds the package (never
committed), so it matches that machine's protobuf. The .proto is found at $VSPEC_PROTO, in
the repository (../../proto/vspec.proto, pip's in-tree build) or in an sdist's proto/ (the
sdist command below puts it there).
"""

import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))


def find_proto():
    candidates = [os.environ.get("VSPEC_PROTO"),
                  os.path.join(HERE, "..", "..", "proto", "vspec.proto"),
                  os.path.join(HERE, "proto", "vspec.proto")]
    for c in candidates:
        if c and os.path.isfile(c):
            return os.path.abspath(c)
    raise SystemExit("vspec: proto/vspec.proto not found (looked in %s); build from the "
                     "repository or set VSPEC_PROTO" % ", ".join(c for c in candidates if c))


def run_protoc(proto, out_dir):
    protoc = shutil.which(os.environ.get("PROTOC", "protoc"))
    if not protoc:
        raise SystemExit("vspec: protoc not found: install protobuf-compiler (Debian) or set "
                         "PROTOC")
    out_dir = os.path.abspath(out_dir)  # protoc runs in the .proto's directory
    os.makedirs(out_dir, exist_ok=True)
    subprocess.check_call([protoc, "-I" + os.path.dirname(proto), "--python_out=" + out_dir,
                           os.path.basename(proto)], cwd=os.path.dirname(proto))


class BuildPy(build_py):
    def run(self):
        super().run()
        run_protoc(find_proto(), os.path.join(self.build_lib, "vspec"))


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        os.makedirs(os.path.join(base_dir, "proto"), exist_ok=True)
        shutil.copyfile(find_proto(), os.path.join(base_dir, "proto", "vspec.proto"))


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
