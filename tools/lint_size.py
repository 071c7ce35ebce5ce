#!/usr/bin/env python3
"""lint_size.py - the size rules of docs/DESIGN.md section 1 (`make lint`):

  * no hand-written source file over MAX_FILE lines (files whose first 8 lines say
    "GENERATED" are exempt: they are rewritten by a script, never edited);
  * no C / CUDA host function over MAX_FN lines (CUDA __global__ kernels and __device__
    helpers are exempt: a kernel is read as one piece with its reference).

Functions are found by shape, as the tree writes them: a definition starts on a line at column 0
(its opening brace at column 0 on the next line, or at the end of the signature line) and ends
at the next '}' at column 0. Prints one line per violation and exits 1 if there is any.
Usage: python3 tools/lint_size.py [files...]   (default: every tracked source file)
"""
import re
import subprocess
import sys

MAX_FILE = 1200
MAX_FN = 150
SRC = ('.c', '.h', '.cu', '.cuh', '.py', '.sh', '.js', '.mjs')
FN_SRC = ('.c', '.h', '.cu', '.cuh')
NOT_FN = re.compile(r'^(struct|enum|union|typedef|extern|static const|const|namespace|#|template)')


def functions(lines):
    """(start line, name, length, is_kernel) of every function definition."""
    start = None
    for i, l in enumerate(lines):
        if start is None:
            brace_own = l.startswith('{')
            brace_end = (re.match(r'^[A-Za-z_]', l) and l.rstrip().endswith('{') and '(' in l
                         and not NOT_FN.match(l) and '=' not in l.split('(')[0])
            if not (brace_own or brace_end):
                continue
            first = i - 1 if brace_own else i
            sig, name = [], '?'
            for k in range(first, max(-1, first - 30), -1):
                if k < 0 or (k < first and (not lines[k].strip() or lines[k].startswith(('}', '/', ' *')))):
                    break
                sig.insert(0, lines[k])
            m = re.search(r'([A-Za-z_][A-Za-z0-9_]*)\s*\(', ' '.join(sig))
            if m:
                name = m.group(1)
            kernel = any('__global__' in s or '__device__' in s for s in sig)
            start = (first, name, kernel)
        elif l.startswith('}'):
            yield start[0] + 1, start[1], i - start[0] + 1, start[2]
            start = None


def main(argv):
    files = argv or subprocess.run(['git', 'ls-files'], capture_output=True, text=True,
                                   check=True).stdout.split()
    bad = 0
    for f in files:
        if not f.endswith(SRC):
            continue
        try:
            text = open(f, errors='replace').read()
        except OSError:
            continue
        lines = text.split('\n')
        if any('GENERATED' in l for l in lines[:8]):
            continue
        n = len(lines) - (1 if text.endswith('\n') else 0)
        if n > MAX_FILE:
            print('%s: %d lines (more than %d)' % (f, n, MAX_FILE))
            bad += 1
        if f.endswith(FN_SRC):
            for line, name, length, kernel in functions(lines):
                if length > MAX_FN and not kernel:
                    print('%s:%d: function %s: %d lines (more than %d)' % (f, line, name, length, MAX_FN))
                    bad += 1
    if bad:
        print('lint_size: %d violation%s' % (bad, '' if bad == 1 else 's'))
        return 1
    return 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
