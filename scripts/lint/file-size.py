#!/usr/bin/env python3
"""Fail when a Rust source file holds more than MAX_LINES lines of non-test code.

Scope: every `.rs` file under `src/` and `crates/*/src/` (the code that ships; `tests/`,
`benches/` and `vmtests/` are test code as a whole and are not walked).

What is counted: every line of the file (blank lines and comments included: they are read as
much as code) except the lines of its test modules. A test module is, precisely, one of:

1. A whole file declared with `#[cfg(test)]`: the file its parent reaches through a
   `mod NAME;` item that carries the attribute `#[cfg(test)]` (written alone on its line,
   possibly among other attribute lines such as `#[path = "..."]`), e.g.
   `#[cfg(test)] mod tests;` -> `tests.rs`, `#[cfg(test)] mod fault_tests;` ->
   `fault_tests.rs`, `#[cfg(test)] pub(crate) mod fake;` -> `fake.rs`. Every file below such
   a file (its own `mod` children) is test code too. Files are found from each crate root
   (`src/lib.rs`, `src/main.rs`) by the compiler's rules: `mod NAME;` in `lib.rs`, `main.rs`
   or `mod.rs` resolves to `NAME.rs` or `NAME/mod.rs` beside it; in `parent.rs` to
   `parent/NAME.rs` or `parent/NAME/mod.rs`; `#[path = "p"]` to `p` beside the declaring file.
2. An inline block: a line `#[cfg(test)]`, then any further attribute lines, then a line
   `[pub[(...)]] mod NAME {`; the block runs from that `#[cfg(test)]` line to the first later
   line that is only `}` at the `mod` line's indentation (the code is rustfmt-formatted,
   which `make lint` checks first, so the closing brace of the block is found by its
   indentation without parsing Rust).

Anything else under `#[cfg(test)]` (a test-only function or `use`) counts as code.
A file that no crate root reaches is counted whole.

Output: one line per file over the limit, `path: N lines outside test modules (max 800)`,
and exit status 1; nothing and status 0 when every file is within the limit.
Run from the repository root (the Makefile's `lint` does) or pass the root as argument.
"""

import os
import re
import sys

MAX_LINES = 800

CFG_TEST = re.compile(r"^\s*#\[cfg\(test\)\]\s*$")
ATTRIBUTE = re.compile(r"^\s*#\[.*\]\s*$")
PATH_ATTRIBUTE = re.compile(r'^\s*#\[path\s*=\s*"([^"]+)"\]\s*$')
MOD_DECL = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?mod\s+([A-Za-z_][A-Za-z0-9_]*)\s*;\s*$")
MOD_BLOCK = re.compile(r"^(\s*)(?:pub(?:\([^)]*\))?\s+)?mod\s+[A-Za-z_][A-Za-z0-9_]*\s*\{\s*$")


def attributes_before(lines, index):
    """The attribute lines directly above line `index` (nearest last)."""
    attrs = []
    i = index - 1
    while i >= 0 and ATTRIBUTE.match(lines[i]):
        attrs.append(lines[i])
        i -= 1
    return attrs


def child_modules(path, lines):
    """(child file path, declared under #[cfg(test)]) for each `mod NAME;` at the top level.

    Declarations inside inline modules are rare here and resolve elsewhere; they are skipped
    (their files then count whole, the safe side)."""
    directory = os.path.dirname(path)
    base = os.path.basename(path)
    if base in ("lib.rs", "main.rs", "mod.rs"):
        own_dir = directory
    else:
        own_dir = os.path.join(directory, base[: -len(".rs")])
    children = []
    for index, line in enumerate(lines):
        match = MOD_DECL.match(line)
        if not match or match.group(1):
            continue
        name = match.group(2)
        attrs = attributes_before(lines, index)
        is_test = any(CFG_TEST.match(a) for a in attrs)
        explicit = [PATH_ATTRIBUTE.match(a).group(1) for a in attrs if PATH_ATTRIBUTE.match(a)]
        if explicit:
            candidates = [os.path.join(directory, explicit[0])]
        else:
            candidates = [
                os.path.join(own_dir, name + ".rs"),
                os.path.join(own_dir, name, "mod.rs"),
            ]
        for candidate in candidates:
            if os.path.isfile(candidate):
                children.append((os.path.normpath(candidate), is_test))
                break
    return children


def counted_lines(lines):
    """Lines outside inline `#[cfg(test)] mod NAME { ... }` blocks (rule 2)."""
    count = 0
    index = 0
    while index < len(lines):
        if CFG_TEST.match(lines[index]):
            j = index + 1
            while j < len(lines) and ATTRIBUTE.match(lines[j]):
                j += 1
            block = MOD_BLOCK.match(lines[j]) if j < len(lines) else None
            if block:
                closing = block.group(1) + "}"
                k = j + 1
                while k < len(lines) and lines[k].rstrip() != closing:
                    k += 1
                index = k + 1
                continue
        count += 1
        index += 1
    return count


def read_lines(path):
    with open(path, encoding="utf-8") as handle:
        return handle.read().splitlines()


def test_files(roots):
    """Every file reached from a crate root through a `#[cfg(test)]` declaration (rule 1)."""
    tests = set()
    seen = set()
    stack = [(root, False) for root in roots]
    while stack:
        path, is_test = stack.pop()
        if (path, is_test) in seen:
            continue
        seen.add((path, is_test))
        if is_test:
            tests.add(path)
        for child, child_test in child_modules(path, read_lines(path)):
            stack.append((child, is_test or child_test))
    return tests


def source_dirs(repo):
    dirs = [os.path.join(repo, "src")]
    crates = os.path.join(repo, "crates")
    if os.path.isdir(crates):
        for crate in sorted(os.listdir(crates)):
            candidate = os.path.join(crates, crate, "src")
            if os.path.isdir(candidate):
                dirs.append(candidate)
    return dirs


def main():
    repo = sys.argv[1] if len(sys.argv) > 1 else "."
    failures = []
    for src in source_dirs(repo):
        roots = [
            os.path.normpath(os.path.join(src, root))
            for root in ("lib.rs", "main.rs")
            if os.path.isfile(os.path.join(src, root))
        ]
        tests = test_files(roots)
        for directory, _, files in sorted(os.walk(src)):
            for name in sorted(files):
                if not name.endswith(".rs"):
                    continue
                path = os.path.normpath(os.path.join(directory, name))
                if path in tests:
                    continue
                count = counted_lines(read_lines(path))
                if count > MAX_LINES:
                    failures.append((os.path.relpath(path, repo), count))
    for path, count in failures:
        print(f"{path}: {count} lines outside test modules (max {MAX_LINES})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
