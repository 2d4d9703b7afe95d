#!/usr/bin/env python3
"""Check that the docs (README.md, bench/README.md, docs/*.md) name only what exists.

What is checked, outside fenced code blocks (``` … ```, which hold commands and output):

1. A code span that is a Rust path, `a::b` (optionally `a::b::{c, d}`, a trailing `!` or
   `(…)`; a bare a::b in the prose counts as a code span), must name something defined in the
   workspace: a crate, module, fn, struct, enum, variant, trait, type, const, static or macro,
   or an associated item (`Type::method`); items of `#[cfg(test)]` modules and integration tests
   (crates/*/tests/*.rs, each a crate named after its file) count.
   - `granary_core::placement::pool` (first segment a workspace crate, `-` written `_`) must
     be that exact path, re-exports (`pub use`) included.
   - Any other path is relative: it must be the tail of a defined path, whole segments, e.g.
     `placement::pool`, `lifecycle::claim_check`, `Table::entry`.
   - A path into another crate (`std::…`, `libc::…`, any dependency of a Cargo.toml) is not
     checked.
2. A code span `FILE::item` (FILE ends in `.rs` or `.py`, or contains a `/`) must name an
   existing file — a repository path, or a file name that exists somewhere in the repository —
   that defines `item` (a Rust item, or a Python `def`/`class`; pytest parameters `[…]` are
   ignored). A span `::item` continues the previous FILE of the same document. A document may
   declare short names: "`faults` = `tests/e2e/test_agent_faults.py`" makes `faults::test_x`
   mean that file.
3. A repository path — in a code span or in the prose — whose first component is a top-level
   entry of the repository (`crates/…`, `docs/…`, `bench/…`, `results/…`, …) must exist
   (`*` globs allowed; `<placeholder>` paths are skipped).
4. A relative Markdown link `[text](path#anchor)` must reach an existing file and, with an
   anchor into a Markdown file, one of its headings.
5. docs/configuration.md must name every `--flag` of the command line (clap `#[arg(long)]`
   fields in crates/*/src, hidden ones aside), every key of the configuration file (the serde
   schema, crates/granary-core/src/config/schema.rs; as `[section] key` or `key =` under its
   section in a TOML block) and every `GRANARY_*` variable the code names.
6. docs/troubleshooting.md quotes only messages the code prints: the first cell of each table
   row is a code span whose pieces between `…` placeholders (those of 6 characters or more)
   must occur in a string literal of crates/*/src.

A code span holding white space is prose or a command and is not read as a path; one without
white space that contains `::` but is not a path of rule 1 or 2 is an error (write it so the
check can read it). Nothing is compiled: the Rust sources are read with a small lexer, so items
made by macros other than `macro_rules!` definitions are not seen.

Usage:
    scripts/check-docs.py               check README.md, bench/README.md and docs/*.md; exit 1 on
                                        any problem
    scripts/check-docs.py FILE.md …     check these files
    scripts/check-docs.py --list        also print every reference and what it resolved to
    scripts/check-docs.py --self-test   show that the check fails on names that do not exist
                                        (with --list: each case and the errors it gives)

For a path that resolves to nothing, the error lists defined paths with the same last segment
("did you mean …"), so renaming a module or moving it into another crate makes the docs' pass a
matter of following the suggestions.
"""

import argparse
import glob
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP_DIRS = {".git", "target", "node_modules", "__pycache__", ".pytest_cache"}


# ---------------------------------------------------------------------------------------------
# Rust: a lexer and an item parser, enough to list what each module defines.

ID_START = re.compile(r"[A-Za-z_]")
ID_CHARS = re.compile(r"[A-Za-z0-9_]*")


def tokenize(src):
    """Identifiers, punctuation and literals of a Rust source; comments and white space dropped."""
    toks = []
    i, n = 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if src.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif src.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif re.match(r'b?r#*"', src[i:i + 8]) and (i == 0 or not re.match(r"\w", src[i - 1])):
            m = re.match(r'b?r(#*)"', src[i:])
            end = '"' + m.group(1)
            j = src.find(end, i + m.end())
            i = n if j < 0 else j + len(end)
            toks.append(("lit", ""))
        elif c == '"' or (c == "b" and src.startswith('b"', i)):
            i += 2 if c == "b" else 1
            while i < n and src[i] != '"':
                i += 2 if src[i] == "\\" else 1
            i += 1
            toks.append(("lit", ""))
        elif c == "'" or (c == "b" and src.startswith("b'", i)):
            j = i + (2 if c == "b" else 1)
            if j < n and src[j] == "\\":
                k = src.find("'", j + 2)
                i = n if k < 0 else k + 1
                toks.append(("lit", ""))
            elif j + 1 < n and src[j + 1] == "'":
                i = j + 2
                toks.append(("lit", ""))
            else:  # a lifetime or a label
                m = ID_CHARS.match(src, j)
                i = m.end()
                toks.append(("life", src[j:i]))
        elif c == "r" and src.startswith("r#", i) and i + 2 < n and ID_START.match(src[i + 2]):
            m = ID_CHARS.match(src, i + 2)
            toks.append(("id", src[i + 2:m.end()]))
            i = m.end()
        elif ID_START.match(c):
            m = ID_CHARS.match(src, i)
            toks.append(("id", src[i:m.end()]))
            i = m.end()
        elif c.isdigit():
            m = re.compile(r"[0-9][0-9A-Za-z_]*(\.[0-9][0-9A-Za-z_]*)?").match(src, i)
            i = m.end()
            toks.append(("lit", ""))
        elif src.startswith("::", i):
            toks.append(("p", "::"))
            i += 2
        else:
            toks.append(("p", c))
            i += 1
    return toks


OPEN = {"(": ")", "[": "]", "{": "}"}


def skip_group(toks, i):
    """toks[i] opens a group; return the index after its closing token."""
    depth = 0
    while i < len(toks):
        k, v = toks[i]
        if k == "p" and v in OPEN:
            depth += 1
        elif k == "p" and v in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return i


def skip_to(toks, i, stops):
    """Advance to the first token in `stops` outside any group; return its index."""
    while i < len(toks):
        k, v = toks[i]
        if k == "p" and v in stops:
            return i
        if k == "p" and v in ("(", "["):
            i = skip_group(toks, i)
            continue
        i += 1
    return i


class Index:
    """Every path the workspace defines, as tuples: ('granary_core', 'placement', 'pool')."""

    def __init__(self):
        self.defs = set()
        self.aliases = []  # (module, name, target path, is_glob)
        self.file_items = {}  # file (relative) -> set of item names defined in it
        self.crates = {}  # crate ident -> root file
        self.external = {"std", "core", "alloc", "proc_macro", "test"}

    # -- building

    def add(self, path, file):
        self.defs.add(tuple(path))
        self.file_items.setdefault(file, set()).add(path[-1])

    def parse_crate(self, ident, root_file):
        self.crates[ident] = root_file
        self.defs.add((ident,))
        self.parse_file(root_file, (ident,), mod_dir=os.path.dirname(root_file))

    def parse_file(self, file, modpath, mod_dir):
        try:
            with open(file, encoding="utf-8") as f:
                toks = tokenize(f.read())
        except OSError:
            return
        rel = os.path.relpath(file, ROOT)
        self.file_items.setdefault(rel, set())
        self.parse_items(toks, 0, modpath, None, rel, mod_dir)

    def parse_items(self, toks, i, modpath, owner, file, mod_dir):
        """Items until the closing `}` of this scope. `owner`: the type or trait of an impl/trait
        block, whose items are registered under it."""
        n = len(toks)
        public = False  # the item being read is `pub` (only public `use`s re-export)
        while i < n:
            k, v = toks[i]
            if k == "p" and v == "}":
                return i + 1
            if k == "p" and v == "#":  # attribute
                j = i + 1
                if j < n and toks[j] == ("p", "!"):
                    j += 1
                if j < n and toks[j] == ("p", "["):
                    i = skip_group(toks, j)  # `#[path = "…"]` is not followed (none in the tree)
                    continue
                i = j
                continue
            if k == "id" and v == "pub":
                i += 1
                if i < n and toks[i] == ("p", "("):
                    i = skip_group(toks, i)
                public = True
                continue
            if k == "id" and v in ("default", "async", "unsafe", "auto"):
                i += 1
                continue
            if k == "id" and v == "extern":
                i += 1
                if i < n and toks[i][0] == "lit":
                    i += 1
                if i < n and toks[i] == ("id", "crate"):
                    i = skip_to(toks, i, {";"}) + 1
                elif i < n and toks[i] == ("p", "{"):  # foreign block: its fns and statics
                    i = self.parse_items(toks, i + 1, modpath, owner, file, mod_dir)
                continue
            if k == "id" and v == "const" and i + 1 < n and toks[i + 1][0] == "id" and toks[i + 1][1] in (
                "fn", "unsafe", "async", "extern"
            ):
                i += 1
                continue
            base = modpath + ((owner,) if owner else ())
            if k == "id" and v != "use":
                public = False
            if k == "id" and v == "fn":
                name = toks[i + 1][1]
                self.add(base + (name,), file)
                j = skip_to(toks, i + 2, {"{", ";"})
                i = skip_group(toks, j) if j < n and toks[j][1] == "{" else j + 1
                continue
            if k == "id" and v in ("struct", "union"):
                name = toks[i + 1][1]
                self.add(base + (name,), file)
                j = skip_to(toks, i + 2, {"{", ";"})
                i = skip_group(toks, j) if j < n and toks[j][1] == "{" else j + 1
                continue
            if k == "id" and v == "enum":
                name = toks[i + 1][1]
                self.add(base + (name,), file)
                j = skip_to(toks, i + 2, {"{"})
                i = self.parse_variants(toks, j + 1, base + (name,), file)
                continue
            if k == "id" and v == "trait":
                name = toks[i + 1][1]
                self.add(base + (name,), file)
                j = skip_to(toks, i + 2, {"{", ";"})
                if j < n and toks[j][1] == "{":
                    i = self.parse_items(toks, j + 1, modpath, name, file, mod_dir)
                else:
                    i = j + 1
                continue
            if k == "id" and v == "impl":
                j = skip_to(toks, i + 1, {"{", ";"})
                ty = impl_type(toks[i + 1:j])
                if j < n and toks[j][1] == "{":
                    i = self.parse_items(toks, j + 1, modpath, ty, file, mod_dir)
                else:
                    i = j + 1
                continue
            if k == "id" and v == "mod" and i + 1 < n and toks[i + 1][0] == "id":
                name = toks[i + 1][1]
                sub = modpath + (name,)
                self.add(sub, file)
                if i + 2 < n and toks[i + 2] == ("p", "{"):
                    i = self.parse_items(toks, i + 3, sub, None, file, os.path.join(mod_dir, name))
                else:
                    for cand in (os.path.join(mod_dir, name + ".rs"), os.path.join(mod_dir, name, "mod.rs")):
                        if os.path.exists(cand):
                            self.parse_file(cand, sub, os.path.join(mod_dir, name))
                            break
                    i = skip_to(toks, i + 2, {";"}) + 1
                continue
            if k == "id" and v in ("type", "const", "static"):
                j = i + 1
                if j < n and toks[j] == ("id", "mut"):
                    j += 1
                if j < n and toks[j][0] == "id" and toks[j][1] != "_":
                    self.add(base + (toks[j][1],), file)
                j = skip_to(toks, j, {";", "{"})
                while j < n and toks[j][1] == "{":  # a block in the value: skip it, go on
                    j = skip_to(toks, skip_group(toks, j), {";", "{"})
                i = j + 1
                continue
            if k == "id" and v == "use":
                j = skip_to(toks, i + 1, {";"})
                if public:
                    for target, alias, is_glob in parse_use(toks[i + 1:j]):
                        self.aliases.append((modpath, alias, target, is_glob))
                public = False
                i = j + 1
                continue
            if k == "id" and v == "macro_rules" and i + 2 < n and toks[i + 1] == ("p", "!"):
                self.add(modpath + (toks[i + 2][1],), file)
                i = skip_group(toks, i + 3)
                continue
            if k == "id" and i + 1 < n and toks[i + 1] == ("p", "!"):  # an item-level macro call
                j = i + 2
                if j < n and toks[j][0] == "id":  # `macro_name! ident { … }`
                    j += 1
                if j < n and toks[j][1] in OPEN:
                    end = skip_group(toks, j)
                    inner = toks[j + 1:end - 1]
                    for a in range(len(inner) - 1):  # items inside (thread_local!, proptest!)
                        if inner[a][0] == "id" and inner[a][1] in ("fn", "static", "const", "struct") \
                                and inner[a + 1][0] == "id":
                            self.add(base + (inner[a + 1][1],), file)
                    i = end
                else:
                    i = j
                continue
            i += 1
        return i

    def parse_variants(self, toks, i, enum_path, file):
        expect = True
        while i < len(toks):
            k, v = toks[i]
            if k == "p" and v == "}":
                return i + 1
            if k == "p" and v == "#":
                i = skip_group(toks, i + 1) if i + 1 < len(toks) and toks[i + 1][1] == "[" else i + 1
                continue
            if k == "p" and v in OPEN:
                i = skip_group(toks, i)
                continue
            if k == "p" and v == ",":
                expect = True
            elif k == "id" and expect:
                self.add(enum_path + (v,), file)
                expect = False
            i += 1
        return i

    # -- resolving re-exports

    def resolve_use(self, modpath, target):
        t = list(target)
        if not t:
            return None
        if t[0] == "crate":
            return (modpath[0],) + tuple(t[1:])
        if t[0] in ("self", "super"):
            base = list(modpath)
            while t and t[0] in ("self", "super"):
                if t.pop(0) == "super":
                    base.pop()
            return tuple(base + t)
        if t[0] in self.crates:
            return tuple(t)
        if modpath + (t[0],) in self.defs:
            return modpath + tuple(t)
        return None

    def finish(self):
        """Give every re-export (`pub use`) the paths below what it names, until nothing changes."""
        resolved = []
        for modpath, alias, target, is_glob in self.aliases:
            r = self.resolve_use(modpath, target)
            if r is not None:
                resolved.append((modpath, alias, r, is_glob))
        for _ in range(6):
            by_prefix = {}
            for d in self.defs:
                for k in range(1, len(d)):
                    by_prefix.setdefault(d[:k], []).append(d)
            new = set()
            for modpath, alias, target, is_glob in resolved:
                if is_glob:
                    for d in by_prefix.get(target, []):
                        new.add(modpath + d[len(target):])
                elif target in self.defs:
                    new.add(modpath + (alias,))
                    for d in by_prefix.get(target, []):
                        new.add(modpath + (alias,) + d[len(target):])
            if new <= self.defs:
                break
            self.defs |= new
        self.suffixes = set()
        self.by_last = {}
        for d in self.defs:
            for k in range(1, len(d)):
                self.suffixes.add(d[k:])
            self.by_last.setdefault(d[-1], []).append(d)

    def knows(self, path):
        if path[0] in self.crates:
            return path in self.defs
        return path in self.suffixes or path in self.defs

    def suggest(self, path):
        cands = sorted(self.by_last.get(path[-1], []), key=lambda d: (len(d), d))
        return ["::".join(d) for d in cands[:4]]


def impl_type(header):
    """The type an `impl … {` header is for: the last path segment before its generics."""
    toks = list(header)
    depth, start = 0, 0
    for idx, (k, v) in enumerate(toks):  # `impl<T> Trait for Type<T>`: take what follows `for`
        if v == "<":
            depth += 1
        elif v == ">":
            depth -= 1
        elif (k, v) == ("id", "for") and depth == 0:
            start = idx + 1
        elif (k, v) == ("id", "where") and depth == 0:
            toks = toks[:idx]
            break
    name, depth = None, 0
    for k, v in toks[start:]:
        if v == "<":
            depth += 1
        elif v == ">":
            depth -= 1
        elif k == "id" and depth == 0 and v not in ("dyn", "mut", "const"):
            name = v
    return name or "?"


def parse_use(toks):
    """A use tree as (target path, name it is known by, glob?) triples."""
    out = []

    def tree(i, prefix):
        path = list(prefix)
        while i < len(toks):
            k, v = toks[i]
            if k == "id":
                path.append(v)
                i += 1
            elif v == "::":
                i += 1
            elif v == "*":
                out.append((tuple(path), None, True))
                return i + 1
            elif v == "{":
                i += 1
                while i < len(toks) and toks[i][1] != "}":
                    i = tree(i, path)
                    if i < len(toks) and toks[i][1] == ",":
                        i += 1
                return i + 1
            else:
                break
            if i < len(toks) and toks[i] == ("id", "as"):
                alias = toks[i + 1][1]
                if alias != "_":
                    out.append((tuple(path), alias, False))
                return i + 2
        if path and path != list(prefix):
            last = path[-1]
            if last == "self":
                path.pop()
                last = path[-1] if path else None
            if last:
                out.append((tuple(path), last, False))
        return i

    tree(0, [])
    return out


def cargo_names(text, sections=("dependencies", "dev-dependencies", "build-dependencies",
                                "workspace.dependencies")):
    names, section = set(), None
    for line in text.splitlines():
        m = re.match(r"\s*\[([^\]]+)\]", line)
        if m:
            section = m.group(1).strip()
            continue
        target_deps = section and section.startswith("target.") and section.endswith("dependencies")
        if section in sections or target_deps:
            m = re.match(r"\s*([A-Za-z0-9_\-]+)\s*[=.]", line)
            if m:
                names.add(m.group(1).replace("-", "_"))
    return names


def build_index():
    idx = Index()
    manifests = sorted(glob.glob(os.path.join(ROOT, "crates", "*", "Cargo.toml")))
    manifests.append(os.path.join(ROOT, "Cargo.toml"))
    for manifest in manifests:
        with open(manifest, encoding="utf-8") as f:
            text = f.read()
        idx.external |= cargo_names(text)
        d = os.path.dirname(manifest)
        m = re.search(r'^\[package\][^\[]*?^name\s*=\s*"([^"]+)"', text, re.M | re.S)
        if not m:
            continue
        ident = m.group(1).replace("-", "_")
        lm = re.search(r'^\[lib\][^\[]*?^name\s*=\s*"([^"]+)"', text, re.M | re.S)
        lib = os.path.join(d, "src", "lib.rs")
        main = os.path.join(d, "src", "main.rs")
        if os.path.exists(lib):
            idx.parse_crate(lm.group(1) if lm else ident, lib)
        if os.path.exists(main):
            idx.parse_crate(ident, main)
        # Integration tests, benches and examples: each file is a crate of its own.
        for sub in ("tests", "benches", "examples"):
            for f in sorted(glob.glob(os.path.join(d, sub, "*.rs"))):
                name = os.path.splitext(os.path.basename(f))[0]
                idx.parse_file(f, (name,), os.path.join(d, sub, name))
                idx.defs.add((name,))
    idx.external -= set(idx.crates)
    idx.finish()
    return idx


# ---------------------------------------------------------------------------------------------
# The repository's files and Python definitions.

def repo_files():
    out = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
        for f in filenames:
            out.append(os.path.relpath(os.path.join(dirpath, f), ROOT))
    return out


def python_defs(path):
    try:
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError):
        return set()
    return set(re.findall(r"^\s*(?:async\s+)?(?:def|class)\s+(\w+)", text, re.M))


# ---------------------------------------------------------------------------------------------
# Markdown.

RUST_PATH = re.compile(r"^(?:::)?[A-Za-z_][A-Za-z0-9_]*(?:::[A-Za-z_][A-Za-z0-9_]*)*"
                       r"(?:::\{[A-Za-z0-9_, :]+\})?!?$")
FILE_ITEM = re.compile(r"^([\w.\-/]+?)((?:::[\w]+)+)(\[[^\]]*\])?$")
REPO_PATH = re.compile(r"^(?:\./)?[\w.\-]+(?:/[\w.\-*]*)+$")


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"`", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


def headings(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return set()
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return {slug(h) for h in re.findall(r"^#+\s+(.*)$", text, re.M)}


class Checker:
    def __init__(self, idx, files):
        self.idx = idx
        self.files = set(files)
        self.top = {f.split("/")[0] for f in files}
        self.by_base = {}
        for f in files:
            self.by_base.setdefault(os.path.basename(f), []).append(f)
        self.pydefs = {}
        self.errors = []
        self.listing = []

    def error(self, doc, line, msg):
        self.errors.append(f"{doc}:{line}: {msg}")

    def note(self, doc, line, ref, what):
        self.listing.append(f"{doc}:{line}: {ref} -> {what}")

    def path_exists(self, p):
        p = p[2:] if p.startswith("./") else p
        p = p.rstrip("/")
        if "*" in p:
            return bool(glob.glob(os.path.join(ROOT, p)))
        return os.path.exists(os.path.join(ROOT, p))

    def is_repo_path(self, s):
        s = s[2:] if s.startswith("./") else s
        return bool(REPO_PATH.match(s)) and s.split("/")[0] in self.top and "<" not in s

    def defines(self, f, item):
        if f.endswith(".py"):
            if f not in self.pydefs:
                self.pydefs[f] = python_defs(f)
            return item in self.pydefs[f]
        return item in self.idx.file_items.get(f, set())

    def check_file_item(self, doc, line, span, fname, items):
        if "/" in fname:
            cands = [fname.lstrip("./")] if self.path_exists(fname) else []
        else:
            cands = self.by_base.get(fname, [])
        if not cands:
            self.error(doc, line, f"`{span}`: no file {fname} in the repository")
            return
        item = items[-1]
        hits = [f for f in cands if self.defines(f, item)]
        if hits:
            self.note(doc, line, span, f"{hits[0]}::{item}")
        else:
            self.error(doc, line, f"`{span}`: {item} is not defined in {', '.join(cands)}")

    def check_rust_path(self, doc, line, span):
        s = span.rstrip("!")
        s = s[2:] if s.startswith("::") else s
        m = re.match(r"^(.*?)::\{([^}]*)\}$", s)
        paths = [f"{m.group(1)}::{x.strip()}" for x in m.group(2).split(",") if x.strip()] if m else [s]
        for p in paths:
            segs = tuple(x for x in p.split("::") if x)
            while segs and segs[0] in ("crate", "self", "super"):
                segs = segs[1:]
            if not segs:
                continue
            if segs[0] in self.idx.external:
                self.note(doc, line, span, "another crate's (not checked)")
                continue
            if self.idx.knows(segs):
                self.note(doc, line, span, "defined")
                continue
            hint = self.idx.suggest(segs)
            more = f"; did you mean {', '.join('`' + h + '`' for h in hint)}?" if hint else ""
            self.error(doc, line, f"`{span}` names nothing defined in the code{more}")

    def check_doc(self, doc, text):
        aliases = {}
        for a, target in re.findall(r"`([\w.]+)`\s*=\s*`([^`\s]+\.(?:py|rs))`", text):
            aliases[a] = target
        last_file = None
        in_fence = False
        for lineno, raw in enumerate(text.splitlines(), 1):
            if raw.lstrip().startswith("```"):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            line = raw.replace("\\|", "|")
            spans = [m.group(2).strip() for m in re.finditer(r"(`+)(.+?)\1", line)]
            # `a::b` written without backticks is read as if it had them
            spans += re.findall(r"(?<![\w`])((?:[\w.\-/]+)?::\w+(?:::\w+)*)",
                                re.sub(r"(`+)(.+?)\1", " ", line))
            for span in spans:
                if re.search(r"\s", span.split("(")[0]):
                    continue
                core = span.split("(")[0] if "::" in span.split("(")[0] else span
                if "::" in core:
                    fm = FILE_ITEM.match(core)
                    first = core.split("::")[0]
                    if core.startswith("::") and last_file:
                        items = [x for x in re.sub(r"\[.*\]$", "", core).split("::") if x]
                        self.check_file_item(doc, lineno, span, last_file, items)
                    elif fm and (first in aliases or first.endswith((".py", ".rs")) or "/" in first):
                        fname = aliases.get(first, first)
                        items = [x for x in fm.group(2).split("::") if x]
                        last_file = fname
                        self.check_file_item(doc, lineno, span, fname, items)
                    elif RUST_PATH.match(core):
                        self.check_rust_path(doc, lineno, core)
                    else:
                        self.error(doc, lineno, f"`{span}`: contains `::` but is not a path this "
                                                "check can read (see scripts/check-docs.py --help)")
                elif self.is_repo_path(core.rstrip(".,;:")):
                    p = core.rstrip(".,;:")
                    if self.path_exists(p):
                        self.note(doc, lineno, p, "exists")
                    else:
                        self.error(doc, lineno, f"`{p}`: no such file or directory in the repository")
            prose = re.sub(r"(`+)(.+?)\1", " ", line)
            # links
            for m in re.finditer(r"\]\(([^)\s]+)\)", prose):
                self.check_link(doc, lineno, m.group(1))
            prose = re.sub(r"\]\(([^)\s]+)\)", "] ", prose)
            # bare repository paths in the prose
            for m in re.finditer(r"(?<![\w/.\-<])((?:\./)?[\w.\-]+/[\w.\-/*]*[\w/*])", prose):
                p = m.group(1)
                if self.is_repo_path(p):
                    if self.path_exists(p):
                        self.note(doc, lineno, p, "exists")
                    else:
                        self.error(doc, lineno, f"{p}: no such file or directory in the repository")

    def check_link(self, doc, line, target):
        if re.match(r"^[a-z]+:", target):
            return
        path, _, anchor = target.partition("#")
        base = os.path.dirname(os.path.join(ROOT, doc))
        full = os.path.normpath(os.path.join(base, path)) if path else os.path.join(ROOT, doc)
        if not os.path.exists(full):
            self.error(doc, line, f"link ({target}): no such file")
            return
        if anchor and full.endswith(".md") and anchor not in headings(full):
            self.error(doc, line, f"link ({target}): no heading #{anchor} in {os.path.relpath(full, ROOT)}")
            return
        self.note(doc, line, target, "link ok")


# ---------------------------------------------------------------------------------------------
# docs/configuration.md lists every flag, configuration key and environment variable.

def balanced(text, i):
    """text[i] is `(`: the index after its matching `)`."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == "(":
            depth += 1
        elif text[j] == ")":
            depth -= 1
            if depth == 0:
                return j + 1
    return len(text)


def cli_flags():
    """Every `--flag` the command line accepts: clap `#[arg(long …)]` fields in crates/*/src,
    less those of hidden commands and hidden arguments. Returns {flag: "file:line"}."""
    flags = {}
    sources = {}
    for path in sorted(glob.glob(os.path.join(ROOT, "crates", "*", "src", "**", "*.rs"), recursive=True)):
        with open(path, encoding="utf-8") as f:
            sources[path] = f.read()
    hidden = set()  # argument structs of hidden subcommands, wherever they are declared
    for text in sources.values():
        hidden |= set(re.findall(r"#\[command\([^)]*hide\s*=\s*true[^)]*\)\]\s*\w+\((?:[\w:]+::)?(\w+)\)",
                                 text))
    for path, text in sources.items():
        for m in re.finditer(r"#\[arg\(", text):
            end = balanced(text, m.end() - 1)
            attr = text[m.end():end - 1]
            if not re.search(r"(^|[\s,])long\b", attr) or re.search(r"hide\s*=\s*true", attr):
                continue
            field = re.match(r"\)\]\s*(?:(?:#\[[^\n]*\]|///[^\n]*)\s*)*(?:pub(?:\([^)]*\))?\s+)?(\w+)\s*:",
                             text[end - 1:])
            if not field:
                continue
            structs = re.findall(r"\bstruct\s+(\w+)", text[:m.start()])
            if structs and structs[-1] in hidden:
                continue
            named = re.search(r"\blong\s*=\s*\"([^\"]+)\"", attr)
            flag = "--" + (named.group(1) if named else field.group(1).replace("_", "-"))
            flags.setdefault(flag, f"{os.path.relpath(path, ROOT)}:{text[:m.start()].count(chr(10)) + 1}")
    return flags


def config_keys():
    """Every (section, key) of the configuration file, from the serde schema's structs."""
    path = os.path.join(ROOT, "crates", "granary-core", "src", "config", "schema.rs")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError:
        return set()
    bodies = {name: body for name, body in re.findall(r"struct\s+(\w+)\s*\{(.*?)\n\}", text, re.S)}
    keys = set()
    for section, ty in re.findall(r"^\s*(?:pub\s+)?(\w+)\s*:\s*([\w<>]+),", bodies.get("File", ""), re.M):
        inner = re.sub(r"^(?:Vec|Option)<(\w+)>$", r"\1", ty)
        for key in re.findall(r"^\s*(?:pub\s+)?(\w+)\s*:", bodies.get(inner, ""), re.M):
            keys.add((section, key))
    return keys


def env_vars():
    """Every GRANARY_* variable the code names (crates/*/src, crates/*/build.rs)."""
    names = set()
    files = glob.glob(os.path.join(ROOT, "crates", "*", "src", "**", "*.rs"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "crates", "*", "build.rs"))
    for path in files:
        with open(path, encoding="utf-8") as f:
            names |= set(re.findall(r"\bGRANARY_[A-Z0-9_]*[A-Z0-9]\b", f.read()))
    return names


def check_configuration(checker, doc="docs/configuration.md", text=None):
    full = os.path.join(ROOT, doc)
    if text is None:
        if not os.path.exists(full):
            checker.error(doc, 0, "missing: it must list every flag, configuration key and variable")
            return
        with open(full, encoding="utf-8") as f:
            text = f.read()
    spans = set(re.findall(r"`([^`\n]+)`", text))
    words = set()
    for s in spans:
        words |= set(re.findall(r"--[\w-]+|GRANARY_[A-Z0-9_]+", s))
    documented = set()  # (section, key): `[section] key` in the prose, or key = … in a TOML block
    for sec, key in re.findall(r"`\[\[?(\w+)\]?\]\s+(\w+)", text):
        documented.add((sec, key))
    section = None
    in_fence = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
            section = None
            continue
        if not in_fence:
            continue
        m = re.match(r"^\s*#?\s*\[\[?(\w+)\]?\]", line)
        if m:
            section = m.group(1)
            continue
        m = re.match(r"^\s*#?\s*(\w+)\s*=", line)
        if m and section:
            documented.add((section, m.group(1)))
    for flag, where in sorted(cli_flags().items()):
        if flag not in words:
            checker.error(doc, 0, f"`{flag}` ({where}) is not documented")
    for sec, key in sorted(config_keys() - documented):
        checker.error(doc, 0, f"configuration key `[{sec}] {key}` is not documented")
    for var in sorted(env_vars() - words):
        checker.error(doc, 0, f"`{var}` (named in crates/) is not documented")


# ---------------------------------------------------------------------------------------------
# docs/troubleshooting.md quotes only messages the code prints.

def code_strings():
    """The text of every string literal in crates/*/src and crates/*/build.rs, with Rust's
    line continuations (a backslash ending a line) joined as the compiler joins them."""
    out = []
    files = glob.glob(os.path.join(ROOT, "crates", "*", "src", "**", "*.rs"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "crates", "*", "build.rs"))
    for path in files:
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"'\\?\"'", "''", f.read())  # char literals '"' and '\\"'
        for m in re.finditer(r'"((?:[^"\\]|\\.)*)"', text, re.S):
            s = re.sub(r"\\\n\s*", "", m.group(1))
            out.append(s.replace('\\"', '"').replace("{{", "{").replace("}}", "}"))
    return "\n".join(out)


def check_messages(checker, doc="docs/troubleshooting.md", text=None, corpus=None):
    """The first cell of each table row is a message (or its start) the code prints: every
    piece between `…` placeholders, of 6 characters or more, must occur in a string literal."""
    if text is None:
        full = os.path.join(ROOT, doc)
        if not os.path.exists(full):
            return
        with open(full, encoding="utf-8") as f:
            text = f.read()
    corpus = code_strings() if corpus is None else corpus
    for lineno, line in enumerate(text.splitlines(), 1):
        m = re.match(r"^\|\s*(`+)(.+?)\1\s*\|", line)
        if not m or set(m.group(2)) <= set("-: "):
            continue
        msg = m.group(2).strip()
        pieces = [p.strip() for p in msg.split("…")]
        missing = [p for p in pieces if len(p) >= 6 and p not in corpus]
        if missing:
            checker.error(doc, lineno, f"`{msg}`: the code prints no such message "
                                       f"(not found: {', '.join(repr(p) for p in missing)})")
        else:
            checker.note(doc, lineno, msg, "printed by the code")


def default_docs():
    docs = glob.glob(os.path.join(ROOT, "docs", "*.md"))
    return ["README.md", "bench/README.md"] + sorted(os.path.relpath(p, ROOT) for p in docs)


def self_test(checker, verbose):
    """The check must fail on what does not exist, and pass on what does."""
    cases = [
        ("`granary_shm::layout::VERSION` and `lifecycle::claim_check`", True),
        ("`granary_shm::StatRec` (a re-export) and `granary_shm::job::SEEN`", True),
        ("`Table::entry`", True),
        ("`placement::revalidate`", False),
        ("`granary_core::lifecycle`", False),
        ("`states::invalidate_by_agent`", False),
        ("`crates/granary-shm/src/nowhere.rs`", False),
        ("see crates/granary-shm/src/nowhere.rs for it", False),
        ("`tests.rs::no_such_test`", False),
        ("`faults` = `tests/e2e/test_agent_faults.py`; `faults::test_no_such_thing`", False),
        ("[gone](docs/nowhere.md)", False),
        ("`a::b/c`", False),
    ]
    wrong = 0
    for text, should_pass in cases:
        checker.errors = []
        checker.check_doc("README.md", text)
        passed = not checker.errors
        if passed != should_pass or verbose:
            verdict = "ok" if passed == should_pass else "WRONG"
            print(f"{verdict:5}  {'passes' if passed else 'fails '}  {text}")
            for e in checker.errors:
                print(f"         {e}")
        wrong += passed != should_pass
    # Rule 5: the configuration page without one flag, one key and one variable.
    with open(os.path.join(ROOT, "docs", "configuration.md"), encoding="utf-8") as f:
        page = f.read()
    for gone, what in (("`--keep-binding`", "a flag"), ("lmdb_index = true", "a key"),
                       ("`GRANARY_AGENT_TIMEOUT`", "a variable")):
        checker.errors = []
        check_configuration(checker, text=page.replace(gone, "…"))
        failed = any(gone.strip("`").split(" ")[0] in e for e in checker.errors)
        cases.append((f"docs/configuration.md without {what} ({gone})", False))
        if not failed or verbose:
            print(f"{'ok' if failed else 'WRONG':5}  {'fails ' if failed else 'passes'}  "
                  f"docs/configuration.md without {gone}")
            for e in checker.errors:
                print(f"         {e}")
        wrong += not failed
    # Rule 6: a message the code does not print.
    checker.errors = []
    check_messages(checker, text="| `the agent ran out of patience` | x | y |\n"
                                 "| `no usable tier` | x | y |\n")
    ok6 = len(checker.errors) == 1 and "patience" in checker.errors[0]
    cases.append(("docs/troubleshooting.md quoting a message no code prints", False))
    if not ok6 or verbose:
        print(f"{'ok' if ok6 else 'WRONG':5}  {'fails ' if checker.errors else 'passes'}  "
              "a troubleshooting row quoting a message no code prints")
        for e in checker.errors:
            print(f"         {e}")
    wrong += not ok6
    failing = sum(1 for _, p in cases if not p)
    print(f"check-docs self-test: {len(cases)} cases, {len(cases) - wrong} as expected "
          f"({failing} must fail)")
    return wrong == 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("docs", nargs="*", help="Markdown files (default: README.md, bench/README.md, "
                                            "docs/*.md; rules 5 and 6 only with the default)")
    ap.add_argument("--list", action="store_true", help="print every reference and what it resolved to")
    ap.add_argument("--self-test", action="store_true", help="show that the check fails on bad names")
    args = ap.parse_args()

    checker = Checker(build_index(), repo_files())
    if args.self_test:
        return 0 if self_test(checker, args.list) else 1
    docs = args.docs or default_docs()
    for doc in docs:
        rel = os.path.relpath(os.path.abspath(doc), ROOT)
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            checker.check_doc(rel, f.read())
    if not args.docs:
        check_configuration(checker)
        check_messages(checker)
    if args.list:
        print("\n".join(checker.listing))
    for e in checker.errors:
        print(e, file=sys.stderr)
    n = len(checker.listing)
    if checker.errors:
        print(f"check-docs: {len(checker.errors)} problem(s) in {len(docs)} file(s) "
              f"({n} references resolved)", file=sys.stderr)
        return 1
    print(f"check-docs: {len(docs)} file(s), {n} references, all resolved")
    return 0


if __name__ == "__main__":
    sys.exit(main())
