#!/usr/bin/env python3
"""Checks that the code outside tests keeps its files and functions short.

Limits: no source file over 600 lines, no function over 100 lines (a function's lines run from the
line of its opening brace to the line of its closing brace; lambdas count toward the function that
holds them). Files under tests/ and examples/ are not checked.

Usage: scripts/check_sizes.py [--root DIR] [--list] [--max-file N] [--max-function N] [--known FILE]
  --list   print every file and function over the limits and exit 0 (a report, not a check)
  --known  the offenders still being split (default scripts/sizes_known.txt), one per line as
           "PATH LINES" or "PATH:FUNCTION LINES": each may stay but not grow; anything else over the
           limits fails, and so does a listed one that is now within them (take it off the list)
Exit status: 0 when everything is within the limits or known, 1 otherwise (each offender is printed).
"""
import argparse
import os
import re
import sys

SOURCE_DIRS = ["src", "quant", "transport", "optim", "sim"]
EXTENSIONS = (".cpp", ".h", ".hpp", ".cc")


def strip_code(text):
    """The text with comments, string and character literals blanked (newlines kept)."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == "R" and text.startswith('R"', i) and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            k = text.find("(", i + 2)
            delim = ")" + text[i + 2:k] + '"'
            j = text.find(delim, k)
            j = n if j < 0 else j + len(delim)
            out.append('""' + "\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # 1'000 is a digit separator
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


HEADER_KINDS = [
    (re.compile(r"\bnamespace\b[^()]*$"), "namespace"),
    (re.compile(r'\bextern\s*""\s*$'), "namespace"),
    (re.compile(r"\b(class|struct|union|enum)\b[^()]*$"), "class"),
]


def classify(header, enclosing):
    """What a '{' opens, from the text before it (since the last ';', '{' or '}')."""
    h = " ".join(header.split())
    for pattern, kind in HEADER_KINDS:
        if pattern.search(h):
            return kind
    if enclosing in ("namespace", "class", "file") and ")" in h:
        before_paren = h[: h.find("(")] if "(" in h else h
        if "=" in before_paren and "operator" not in before_paren:
            return "other"  # an initializer: x = f({...})
        if re.search(r"\)\s*(const|override|final|noexcept|mutable|->[^{]*|:\s*.*|\s)*$", h) or h.endswith(")"):
            return "function"
    return "other"


def functions(text):
    """(name, first line, last line) of each function body in the text."""
    code = strip_code(text)
    found = []
    stack = []  # (kind, line, header)
    header_start = 0
    line = 1
    for i, c in enumerate(code):
        if c == "\n":
            line += 1
        elif c == "{":
            enclosing = stack[-1][0] if stack else "file"
            header = code[header_start:i]
            kind = classify(header, enclosing) if enclosing in ("namespace", "class", "file") else "inner"
            stack.append((kind, line, header))
            header_start = i + 1
        elif c == "}":
            if stack:
                kind, first, header = stack.pop()
                if kind == "function":
                    name = " ".join(header.split())
                    name = name[: name.find("(")] if "(" in name else name
                    found.append((name.split()[-1] if name.split() else "?", first, line))
            header_start = i + 1
        elif c == ";":
            if not stack or stack[-1][0] in ("namespace", "class", "file"):
                header_start = i + 1
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--list", action="store_true", help="report the offenders and exit 0")
    ap.add_argument("--max-file", type=int, default=600)
    ap.add_argument("--max-function", type=int, default=100)
    ap.add_argument("--known", default=None)
    args = ap.parse_args()
    known_path = args.known or os.path.join(args.root, "scripts", "sizes_known.txt")
    known = {}
    if os.path.exists(known_path):
        with open(known_path, encoding="utf-8") as fh:
            for raw in fh:
                row = raw.split("#")[0].split()
                if len(row) == 2:
                    known[row[0]] = int(row[1])
    offenders = []
    for top in SOURCE_DIRS:
        for dirpath, _, files in os.walk(os.path.join(args.root, top)):
            for f in sorted(files):
                if not f.endswith(EXTENSIONS):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, args.root)
                with open(path, encoding="utf-8") as fh:
                    text = fh.read()
                lines = text.count("\n")
                if lines > args.max_file:
                    offenders.append((lines, rel, f"{rel}: {lines} lines (at most {args.max_file})"))
                for name, first, last in functions(text):
                    length = last - first + 1
                    if length > args.max_function:
                        offenders.append((length, f"{rel}:{name}", f"{rel}:{first}: {name}: {length} lines (at most {args.max_function})"))
    failures = []
    seen = set()
    for length, key, message in sorted(offenders, key=lambda o: -o[0]):
        if args.list:
            print(message)
            continue
        seen.add(key)
        if key not in known:
            failures.append(message)
        elif length > known[key]:
            failures.append(f"{message}: grew from {known[key]} lines while it waits to be split")
    if args.list:
        return 0
    for key in sorted(set(known) - seen):
        failures.append(f"{key}: within the limits now: take it off {os.path.relpath(known_path, args.root)}")
    for message in failures:
        print(message)
    if failures:
        print(f"{len(failures)} size problem(s): split what is too long (functions at most {args.max_function} lines, files at most {args.max_file})",
              file=sys.stderr)
        return 1
    print(f"sizes: every file and function within the limits, {len(known)} known ones still to split")
    return 0


if __name__ == "__main__":
    sys.exit(main())
