"""vspec.keys - CURVE key files, read as proto/curve_keys.c reads them.

A key file (written by `vspec keygen`) holds Z85 text, 40 characters per key:

    # vspec CURVE key pair
    public = <40 characters>
    secret = <40 characters>

A file with a single bare 40-character key is read as that key, whatever is asked for.
"""

_Z85 = set("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#")


def is_z85_key(text):
    return isinstance(text, str) and len(text) == 40 and all(c in _Z85 for c in text)


def read_key(path, which):
    """The `which` ("public" or "secret") key of the key file at `path`, as str.

    Raises ValueError naming the file when it holds no such key, OSError when it cannot be
    read. Like the C reader, the first matching line wins.
    """
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            p = line.strip()
            if not p or p.startswith("#"):
                continue
            # "NAME = KEY": Z85 has '=' in its alphabet, so split only after a known name.
            for name in ("public", "secret"):
                if p.startswith(name) and p[len(name):].lstrip(" \t").startswith("="):
                    if name != which:
                        p = None
                    else:
                        p = p[len(name):].lstrip(" \t")[1:].strip()
                    break
            if p is None:
                continue
            word = p.split()[0] if p.split() else ""
            if is_z85_key(word):
                return word
    raise ValueError("%s: no %s key (40 Z85 characters) found" % (path, which))


def key_arg(text, which):
    """`text` is a Z85 key itself, or the path of a key file (as the CLI's options)."""
    if is_z85_key(text):
        return text
    return read_key(text, which)
