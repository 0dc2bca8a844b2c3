#!/usr/bin/python3
"""Self-test of tools/convert_llamagen.py (needs torch; NOT part of `make test`).

    /usr/bin/python3 tools/ref/test_convert.py

Builds micro LlamaGen checkpoints (c2i GPT, t2i GPT, VQ) in a temp dir -- or, when called from
make_golden.py, uses its checkpoints -- converts them to f32 / f16 / bf16 and checks key sets,
stored dtypes, values and metadata; also checkpoint wrappers ("model", "module", "state_dict",
bare dict, --ema) and the argparse errors for missing / inconsistent flags.
"""

import contextlib
import io
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, HERE)
import convert_llamagen  # noqa: E402
import llamagen_ref as R  # noqa: E402
import safetensors_io as st  # noqa: E402

CONVERTER = os.path.join(ROOT, "tools", "convert_llamagen.py")
GPT_FLAGS = ["--n-head", "4", "--grid", "4", "--multiple-of", "32"]


def header(path):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n))


def convert_ok(*argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = convert_llamagen.main(list(argv))
    assert rc == 0, err.getvalue()
    return err.getvalue()


def convert_fails(expect_substring, *argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            convert_llamagen.main(list(argv))
        except SystemExit as e:
            assert e.code == 2, (e.code, err.getvalue())
            msg = err.getvalue()
            assert expect_substring in msg, f"expected {expect_substring!r} in:\n{msg}"
            return msg
    raise AssertionError(f"conversion unexpectedly succeeded: {argv}")


def source_sd(pt):
    sd = torch.load(pt, map_location="cpu")["model"]
    return {k: v for k, v in sd.items() if k != "quantize.codebook_used"}


def check_file(path, sd, meta_expect, dtype):
    hdr = header(path)
    meta = hdr.pop("__metadata__")
    assert set(hdr) == set(sd), (set(hdr) ^ set(sd))
    want_dt = {"f32": "F32", "f16": "F16", "bf16": "BF16"}[dtype]
    for k, info in hdr.items():
        assert info["dtype"] == want_dt, (k, info["dtype"])
        assert info["shape"] == list(sd[k].shape), k
    for k, v in meta_expect.items():
        assert meta.get(k) == v, (k, meta.get(k), v)
    tensors, meta2 = st.load(path)
    assert meta2 == meta
    tdt = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}[dtype]
    for k, v in sd.items():
        want = v.to(tdt).to(torch.float32).numpy()
        assert np.array_equal(tensors[k].astype(np.float32), want), k
    return meta


def run_all(tmp, c2i_pt, t2i_pt, vq_pt):
    out = lambda name: os.path.join(tmp, name)  # noqa: E731
    c2i_meta = {"vspec.kind": "llamagen-gpt", "model_type": "c2i", "block_size": "16",
                "cls_token_num": "1", "num_classes": "10", "n_layer": "2", "n_head": "4",
                "n_kv_head": "4", "dim": "64", "rope_base": "10000.0", "norm_eps": "1e-05",
                "multiple_of": "32", "ffn_dim_multiplier": "none", "vocab_size": "64",
                "caption_dim": "0", "class_dropout_prob": "0.1"}
    t2i_meta = dict(c2i_meta, model_type="t2i", cls_token_num="120", num_classes="0",
                    caption_dim="16")
    vq_meta = {"vspec.kind": "llamagen-vq", "ch": "32", "ch_mult": "[1,2]",
               "num_res_blocks": "2", "z_channels": "32", "codebook_size": "64",
               "codebook_embed_dim": "8", "codebook_l2_norm": "true"}

    # 1. all three kinds x all three dtypes, kind and model type auto-detected
    for dtype in ("f32", "f16", "bf16"):
        p = out(f"c2i_{dtype}.safetensors")
        convert_ok(c2i_pt, p, *GPT_FLAGS, "--dtype", dtype, "--verify")
        m = check_file(p, source_sd(c2i_pt), c2i_meta, dtype)
        assert set(m) == set(c2i_meta), set(m) ^ set(c2i_meta)
        p = out(f"t2i_{dtype}.safetensors")
        convert_ok(t2i_pt, p, *GPT_FLAGS, "--dtype", dtype, "--verify")
        check_file(p, source_sd(t2i_pt), t2i_meta, dtype)
        assert "cls_embedding.uncond_embedding" in header(p)       # buffer kept
        p = out(f"vq_{dtype}.safetensors")
        convert_ok(vq_pt, p, "--dtype", dtype, "--verify", "--image-size", "8")
        m = check_file(p, source_sd(vq_pt), dict(vq_meta, image_size="8"), dtype)
        assert "quantize.codebook_used" not in header(p)
        assert set(m) == set(vq_meta) | {"image_size"}

    # 2. metadata -> config round trip (used by make_golden / training scripts)
    _, meta = st.load(out("c2i_f32.safetensors"))
    cfg = R.gpt_config_from_metadata(meta)
    got = (cfg.dim, cfg.n_head, cfg.kv_heads, cfg.block_size, cfg.num_classes)
    assert got == (64, 4, 4, 16, 10), got
    _, meta = st.load(out("vq_f32.safetensors"))
    assert R.vq_kwargs_from_metadata(meta)["ch_mult"] == [1, 2]

    # 3. alternative flags giving the same metadata
    convert_ok(c2i_pt, out("a.safetensors"), "--n-head", "4", "--image-size", "64",
               "--downsample", "16", "--multiple-of", "32", "--kind", "gpt",
               "--model-type", "c2i", "--cls-token-num", "1")
    assert header(out("a.safetensors"))["__metadata__"] == c2i_meta
    convert_ok(vq_pt, out("b.safetensors"), "--ch-mult", "1,2", "--kind", "vq")
    assert header(out("b.safetensors"))["__metadata__"] == vq_meta
    convert_ok(vq_pt, out("b.safetensors"), "--no-l2-norm")
    assert header(out("b.safetensors"))["__metadata__"]["codebook_l2_norm"] == "false"

    # 4. checkpoint wrappers
    sd = torch.load(c2i_pt, map_location="cpu")["model"]
    ema = {k: v + 1.0 for k, v in sd.items()}
    for name, obj in (("module", {"module": sd}), ("state_dict", {"state_dict": sd}),
                      ("bare", dict(sd)), ("model_ema", {"model": sd, "ema": ema})):
        pt = out(f"wrap_{name}.pt")
        torch.save(obj, pt)
        convert_ok(pt, out("w.safetensors"), *GPT_FLAGS, "--verify")
        got, _ = st.load(out("w.safetensors"))
        assert np.array_equal(got["output.weight"], sd["output.weight"].numpy()), name
    convert_ok(out("wrap_model_ema.pt"), out("w.safetensors"), *GPT_FLAGS, "--ema", "--verify")
    got, _ = st.load(out("w.safetensors"))
    assert np.array_equal(got["output.weight"], ema["output.weight"].numpy())

    # 5. clear errors for missing / inconsistent information
    convert_fails("n_head", c2i_pt, out("e"), "--grid", "4", "--multiple-of", "32")
    convert_fails("block_size", c2i_pt, out("e"), "--n-head", "4", "--multiple-of", "32")
    convert_fails("FFN hidden size", c2i_pt, out("e"), "--n-head", "4", "--grid", "4")
    convert_fails("--preset GPT-B expects", c2i_pt, out("e"), "--preset", "GPT-B", "--grid", "4",
                  "--multiple-of", "32")
    convert_fails("not divisible", c2i_pt, out("e"), "--n-head", "5", "--grid", "4",
                  "--multiple-of", "32")
    convert_fails("contradicts the weights", c2i_pt, out("e"), *GPT_FLAGS, "--model-type", "t2i")
    convert_fails("uncond_embedding has", t2i_pt, out("e"), *GPT_FLAGS, "--cls-token-num", "77")
    convert_fails("no 'ema'", c2i_pt, out("e"), *GPT_FLAGS, "--ema")
    convert_fails("GPT preset", vq_pt, out("e"), "--preset", "GPT-B")
    convert_fails("2 decoder conv_blocks", vq_pt, out("e"), "--preset", "VQ-16")
    convert_fails("2 decoder conv_blocks", vq_pt, out("e"), "--ch-mult", "[1,2,2]")
    convert_fails("stage widths", vq_pt, out("e"), "--ch-mult", "[1,4]")
    convert_fails("not found", out("missing.pt"), out("e"), *GPT_FLAGS)
    torch.save({"optimizer": {}, "steps": 1}, out("nosd.pt"))
    convert_fails("no state dict found", out("nosd.pt"), out("e"), *GPT_FLAGS)

    # 6. the command-line entry point itself
    r = subprocess.run([sys.executable, CONVERTER, c2i_pt, out("cli.safetensors"), *GPT_FLAGS,
                        "--dtype", "bf16", "--verify"], capture_output=True, text=True)
    assert r.returncode == 0 and "verified" in r.stderr, r.stderr
    r = subprocess.run([sys.executable, CONVERTER, c2i_pt, out("cli.safetensors")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "error:" in r.stderr and "n_head" in r.stderr, r.stderr


def build_micro_checkpoints(tmp):
    torch.manual_seed(0)
    paths = []
    for name, model in (
            ("c2i", R.GPT(R.GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16,
                                      num_classes=10, multiple_of=32))),
            ("t2i", R.GPT(R.GPTConfig(dim=64, n_layer=2, n_head=4, vocab_size=64, block_size=16,
                                      caption_dim=16, cls_token_num=120, multiple_of=32,
                                      model_type="t2i"))),
            ("vq", R.VQModel(ch=32, ch_mult=[1, 2], z_channels=32, codebook_size=64))):
        with torch.no_grad():
            for t in model.state_dict().values():
                t.copy_(torch.randn(t.shape))
        p = os.path.join(tmp, f"{name}.pt")
        torch.save({"model": model.state_dict(), "steps": 0}, p)
        paths.append(p)
    return paths


def main():
    tmp = tempfile.mkdtemp(prefix="vspec_convert_test_")
    try:
        run_all(tmp, *build_micro_checkpoints(tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("test_convert: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
