#!/usr/bin/env python3
"""The service's layout rules (docs/DESIGN.md, "Layout" and "Conventions"), checked on the code:

  - a folder includes only headers of its own and of the folders below it (LAYERS): the
    fronts (http/, fleet/) reach the service (daemon/) through its headers, never the reverse;
    a plugin includes only the ABI (vspec/), kernels/common/ and its kind's shared headers;
  - no circle of files: file A calls B when A names a function or a global that B defines;
    no two files that call each other, directly or round a loop;
  - no two files define the same function, static or not (a name found by grep is the one
    that runs; one file may define a name twice, as #if alternatives or C++ overloads, which
    the compiler allows in no other way), no static carries the cross-file prefix vs__, and
    a function that does is named by another file (a test's counts: a test hook);
  - no function over 120 lines, no file over 800.

Sources are C (.c) and CUDA C++ (.cu); headers (.h) are held to the include and length rules.
Run from the repository root: tools/check_layout.py [FOLDER ...] (default: every product
folder). Prints what breaks a rule and exits 1, or prints nothing and exits 0.
"""
import glob
import os
import re
import sys

# Top to bottom; a folder may include its own headers and those of any folder after its row.
LAYERS = [["vspecd"], ["http", "fleet"], ["daemon"], ["client"], ["proto"], ["core"],
          ["kernels"], ["include"]]
SERVICE = ["vspecd", "http", "fleet", "daemon"]
# What a plugin may include besides its own folder's headers and its kind's (../): the ABI and
# the per-element math (it compiles with -Iinclude -Ikernels and links nothing but the host).
PLUGIN_SEES = ("vspec", "common", "..")
# What make check holds to the rules: every product folder.
PRODUCT = SERVICE + ["client", "clients", "proto", "bench", "core", "kernels", "kernels/common",
                     "kernels/host", "kernels/cpu", "kernels/cuda", "include/vspec", "plugins/accept",
                     "plugins/sched", "plugins/drafter", "plugins/backend",
                     "plugins/backend/llamagen", "plugins/backend/eagle", "plugins/backend/mar"]
MAX_FN, MAX_FILE = 120, 800
SOURCES = (".c", ".cu")  # what defines functions; headers only declare (or inline)
PROGRAM_MAINS = {"main"}  # each program defines its own


def rank(folder):
    folder = "include" if folder == "vspec" else folder  # include/vspec/, on -Iinclude
    for i, row in enumerate(LAYERS):
        if folder in row:
            return i
    return None


def strip(text):
    """Comments and string literals blanked, line breaks kept (line numbers stay true)."""
    keep = lambda m: re.sub(r"[^\n]", " ", m.group(0))
    return re.sub(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', keep, text,
                  flags=re.S)


def definitions(code):
    """(name, is_static, first line, last line) of each function defined at file scope.
    A function on one line counts; so do those inside `extern "C" {` and `namespace {` (whose
    braces open no scope of their own here; an anonymous namespace's are static)."""
    out, depth, start, lines, blocks = [], 0, None, code.split("\n"), []
    for n, line in enumerate(lines, 1):
        if depth == 0 and re.match(r"\s*(extern\s*|namespace\s*\w*\s*)\{\s*$", line):
            blocks.append("namespace" in line and not re.search(r"namespace\s*\w+", line))
            continue
        if depth == 0 and blocks and re.match(r"\s*\}\s*;?\s*$", line):
            blocks.pop()
            continue
        if depth == 0 and start is None and re.match(r"[A-Za-z_]", line) and "(" in line \
                and not re.match(r"typedef\b", line) and "=" not in line.split("(")[0]:
            start = n
        if depth == 0 and start is not None and line.rstrip().endswith(";"):
            start = None
        opened = depth
        depth += line.count("{") - line.count("}")
        if opened == 0 and "{" in line and start is not None:
            head = " ".join(lines[start - 1:n])
            m = re.search(r"\b([A-Za-z_]\w*)\s*\([^()]*(?:\([^()]*\)[^()]*)*\)"
                          r"\s*(?:__attribute__.*)?\{", head)
            name = m.group(1) if m else None
            static = bool(m and re.search(r"\bstatic\b", head[:m.start()])) or any(blocks)
            body_start = start
            if depth > 0:
                continue
        if depth == 0 and start is not None and (opened > 0 or "{" in line):
            if name:
                out.append((name, static, body_start, n))
            start = None
    return out


def main(folders):
    files = sorted(f for d in folders for ext in ("c", "h", "cu") for f in glob.glob(f"{d}/*.{ext}"))
    bad = []
    code = {f: strip(open(f, encoding="utf-8").read()) for f in files}
    # includes
    for f in files:
        here = rank(f.split("/")[0])
        for n, line in enumerate(open(f, encoding="utf-8"), 1):
            m = re.match(r'\s*#\s*include\s+"([^"/]+)/', line)
            if m and f.startswith("plugins/") and m.group(1) not in PLUGIN_SEES:
                bad.append(f"{f}:{n}: includes {m.group(1)}/: a plugin sees include/vspec/ and "
                           "kernels/common/ only")
            if not m or here is None:
                continue
            there = rank(m.group(1))
            own, folder = f.split("/")[0], "include" if m.group(1) == "vspec" else m.group(1)
            if folder != own and (there is None or there <= here):
                bad.append(f"{f}:{n}: includes {m.group(1)}/, which is not below {own}/")
    # lengths, names
    defs, statics = {}, {}
    for f in files:
        n_lines = code[f].count("\n")
        if n_lines > MAX_FILE:
            bad.append(f"{f}: {n_lines} lines (at most {MAX_FILE})")
        if not f.endswith(SOURCES):
            continue
        for name, static, a, b in definitions(code[f]):
            if b - a + 1 > MAX_FN:
                bad.append(f"{f}:{a}: {name} is {b - a + 1} lines (at most {MAX_FN})")
            if static and name.startswith("vs__"):
                bad.append(f"{f}:{a}: static {name} carries the cross-file prefix vs__")
            if name in PROGRAM_MAINS:
                continue
            where = (statics if static else defs).setdefault(name, [])
            if f not in where:  # twice in one file: #if alternatives (or C++ overloads)
                where.append(f)
    for name, where in sorted(defs.items()):
        also = where[1:] + statics.get(name, [])
        if also:
            bad.append(f"{name}: defined in {', '.join(where + statics.get(name, []))}")
    for name, where in sorted(statics.items()):
        if len(where) > 1 and name not in defs:
            bad.append(f"{name}: a static of {', '.join(where)}")
    # vs__ is for a cross-file internal: some other file (a test's, for a test hook) names it
    inside = [n for n in defs if n.startswith("vs__")]
    if inside:
        texts = list(code.items()) + [(t, strip(open(t, encoding="utf-8").read())) for t in
                                      glob.glob("tests/**/*.c", recursive=True)]
        named = set()
        for f, text in texts:
            if not f.endswith(".h"):
                named |= {(w, f) for w in re.findall(r"\bvs__\w+", text)}
        for name in sorted(inside):
            if not any((name, f) in named for f, _ in texts if f not in defs[name]):
                bad.append(f"{name}: vs__ but named outside {defs[name][0]} by no file")
    # circles of calls
    arrows = {f: set() for f in files if f.endswith(SOURCES)}
    for f in arrows:
        for word in set(re.findall(r"\b[A-Za-z_]\w*\b", code[f])):
            for g in defs.get(word, ()):
                if g != f:
                    arrows[f].add(g)
    for circle in components(arrows):
        bad.append("circle of files: " + " ".join(sorted(circle)))
    for line in bad:
        print(line)
    return 1 if bad else 0


def components(arrows):
    """Strongly connected components of more than one file (Tarjan, iterative)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]
    for root in arrows:
        if root in index:
            continue
        work = [(root, iter(sorted(arrows[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(arrows.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


if __name__ == "__main__":
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    sys.exit(main(sys.argv[1:] or PRODUCT))
