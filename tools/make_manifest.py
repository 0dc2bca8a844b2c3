#!/usr/bin/python3
"""Write vspec-model.json for a model directory of converted LlamaGen weights.

    /usr/bin/python3 tools/make_manifest.py MODEL_DIR
    /usr/bin/python3 tools/make_manifest.py MODEL_DIR --class-names my_classes.txt

MODEL_DIR holds the GPT and the VQ that tools/convert_llamagen.py wrote (gpt.safetensors and
vq.safetensors unless --gpt / --vq name others). The manifest names them as the target
(backend llamagen) and, for a class-conditional (c2i) GPT, its "class_names": those of
--class-names FILE, or for a GPT with 1000 classes the ImageNet-1k names of
tools/imagenet_classes.txt (LlamaGen's c2i checkpoints are trained on ImageNet-1k). A names
file has one name per line in label order; empty lines and lines starting with '#' are skipped.
The names are checked as vspecd checks them (core/manifest.c): one per class, 1-63 bytes,
no control characters, no blanks at either end, not a number, unique with letter case ignored.
The sampling defaults are left out: vspecd then uses LlamaGen's (sample_c2i.py; top_k off).
Needs only the Python standard library.
"""

import argparse
import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
IMAGENET_NAMES = os.path.join(HERE, "imagenet_classes.txt")
MANIFEST = "vspec-model.json"
NAME_MAX = 63  # bytes of a class name and of the model name (core/manifest.h)


class ManifestError(Exception):
    pass


def safetensors_metadata(path):
    """The __metadata__ of a safetensors file (the header only is read)."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise ManifestError(f"{path}: not a safetensors file (too short)")
            (n,) = struct.unpack("<Q", head)
            if n > 100 << 20:
                raise ManifestError(f"{path}: not a safetensors file (header of {n} bytes)")
            header = json.loads(f.read(n).decode("utf-8"))
    except OSError as e:
        raise ManifestError(f"{path}: {e.strerror}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ManifestError(f"{path}: not a safetensors file (the header is not JSON)")
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    return meta if isinstance(meta, dict) else {}


def read_class_names(path):
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ManifestError(f"{path}: {e.strerror}")
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not UTF-8 text")
    return [line for line in lines if line.strip() and not line.startswith("#")]


def is_control(c):
    """As core/text.c vs_text_is_control: C0, DEL, C1, line separators, bidi controls."""
    cp = ord(c)
    return cp < 0x20 or 0x7f <= cp <= 0x9f or cp in (0x2028, 0x2029, 0x061c, 0x200e, 0x200f) \
        or 0x202a <= cp <= 0x202e or 0x2066 <= cp <= 0x2069


def check_class_names(names, num_classes, path):
    if len(names) != num_classes:
        raise ManifestError(f"{path} has {len(names)} class names, the GPT has "
                            f"{num_classes} classes")
    seen = {}
    for i, name in enumerate(names):
        n = len(name.encode("utf-8"))
        why = None
        if n == 0 or n > NAME_MAX:
            why = f"must be 1-{NAME_MAX} bytes long"
        elif any(is_control(c) for c in name):
            why = "has a control character"
        elif name != name.strip(" "):
            why = "starts or ends with a blank"
        elif name.isascii() and name.isdigit():
            why = "is a number (--class takes numbers as labels)"
        if why:
            raise ManifestError(f"{path}: class {i} '{name}' {why}")
        key = name.encode("utf-8").lower()  # strcasecmp: ASCII letters only
        if key in seen:
            raise ManifestError(f"{path}: classes {seen[key]} and {i} are both '{name}' "
                                f"(letter case aside): make them say which class they are")
        seen[key] = i


def build_manifest(args):
    d = args.model_dir
    if not os.path.isdir(d):
        raise ManifestError(f"{d}: not a directory")
    gpt = safetensors_metadata(os.path.join(d, args.gpt))
    if gpt.get("vspec.kind") != "llamagen-gpt":
        raise ManifestError(f"{os.path.join(d, args.gpt)}: not a GPT written by "
                            f"tools/convert_llamagen.py (vspec.kind is "
                            f"{gpt.get('vspec.kind')!r})")
    vq = safetensors_metadata(os.path.join(d, args.vq))
    if vq.get("vspec.kind") != "llamagen-vq":
        raise ManifestError(f"{os.path.join(d, args.vq)}: not a VQ written by "
                            f"tools/convert_llamagen.py (vspec.kind is {vq.get('vspec.kind')!r})")
    name = args.name or os.path.basename(os.path.abspath(d))
    if not name or len(name.encode("utf-8")) > NAME_MAX:
        raise ManifestError(f"the model name '{name}' must be 1-{NAME_MAX} bytes: pass --name")
    manifest = {"name": name,
                "target": {"backend": "llamagen", "gpt": args.gpt, "vq": args.vq}}
    try:
        num_classes = int(gpt.get("num_classes", "0"))
    except ValueError:
        raise ManifestError(f"{args.gpt}: num_classes {gpt.get('num_classes')!r} is not a number")
    names_file = args.class_names
    if names_file is None and gpt.get("model_type") == "c2i" and num_classes == 1000:
        names_file = IMAGENET_NAMES
    if names_file is not None:
        if gpt.get("model_type") != "c2i" or num_classes <= 0:
            raise ManifestError(f"--class-names: {args.gpt} is not class-conditional")
        names = read_class_names(names_file)
        check_class_names(names, num_classes, names_file)
        manifest["class_names"] = names
    return manifest, names_file, num_classes


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Write MODEL_DIR/vspec-model.json for converted LlamaGen weights, with "
                    "ImageNet-1k class names for a 1000-class c2i GPT.")
    p.add_argument("model_dir", metavar="MODEL_DIR")
    p.add_argument("--gpt", default="gpt.safetensors",
                   help="the GPT's file in MODEL_DIR (default gpt.safetensors)")
    p.add_argument("--vq", default="vq.safetensors",
                   help="the VQ's file in MODEL_DIR (default vq.safetensors)")
    p.add_argument("--name", help="the model's name (default: MODEL_DIR's base name)")
    p.add_argument("--class-names", metavar="FILE",
                   help="class names, one per line in label order (default for a 1000-class "
                        "c2i GPT: tools/imagenet_classes.txt)")
    p.add_argument("--force", action="store_true", help="replace an existing " + MANIFEST)
    args = p.parse_args(argv)
    out = os.path.join(args.model_dir, MANIFEST)
    try:
        if os.path.exists(out) and not args.force:
            raise ManifestError(f"{out} exists: pass --force to replace it")
        manifest, names_file, num_classes = build_manifest(args)
    except ManifestError as e:
        p.error(str(e))
    tmp = out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, out)
    if names_file:
        what = f"{num_classes} class names from {names_file}"
    elif num_classes:
        what = f"no class names ({num_classes} classes: pass --class-names FILE to name them)"
    else:
        what = "no class names (not class-conditional)"
    print(f"wrote {out}: {what}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
