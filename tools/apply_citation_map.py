#!/usr/bin/env python3
"""apply_citation_map.py - rewrite the citations listed in docs/.citation-map.txt (issue 18).

Each map line reads `FILE:LINE: OLD -> NEW`: in FILE, the text OLD (which cites a document that
is not in the repository, or the retired build-gpu/ directory) becomes NEW. The line number only
says where OLD stood when the map was written; the match is by text, because other branches move
and split files before the map is applied. For each entry, in map order:

  * FILE holds OLD exactly once: replace it;
  * FILE does not hold OLD (or FILE is gone): look for OLD in every other file git tracks (but
    the map and this script); exactly one occurrence in the whole tree is replaced there and
    reported as moved;
  * OLD is absent everywhere but NEW is present in FILE: reported as already applied;
  * otherwise (absent, or more than one occurrence): reported and left alone.

Nothing else in any file changes: the bytes around each replacement, line endings and the file
mode are kept, and each changed file is written once (temp file, fsync, rename). Lines starting
with '#' and blank lines of the map are ignored.

Usage: python3 tools/apply_citation_map.py [--dry-run] [--map FILE] [--root DIR]
  --dry-run  report what would change, write nothing
  --map      the map (default: docs/.citation-map.txt under the root)
  --root     the repository root (default: the parent of this script's directory)
Exit: 0 every entry found once (or already applied); 1 usage; 2 malformed map; 4 I/O error;
5 some entries not found or ambiguous (the others are still applied, and each is listed).
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

ENTRY = re.compile(r'^(?P<file>[^:\s][^:]*):(?P<line>\d+): (?P<rest>.*)$')
SEP = ' -> '


class MapError(Exception):
    """A malformed map line (exit 2)."""


def parse_map(path):
    """[(line_no_in_map, file, line, old, new)] of the map at `path`; MapError on a bad line."""
    entries = []
    with open(path, encoding='utf-8') as f:
        for n, raw in enumerate(f, 1):
            text = raw.rstrip('\n')
            if not text.strip() or text.startswith('#'):
                continue
            m = ENTRY.match(text)
            if not m or SEP not in m.group('rest'):
                raise MapError(f'{path}:{n}: expected "FILE:LINE: OLD -> NEW", got: {text[:80]}')
            old, new = m.group('rest').split(SEP, 1)
            if not old:
                raise MapError(f'{path}:{n}: empty old text')
            entries.append((n, m.group('file'), int(m.group('line')), old, new))
    return entries


def tracked_files(root):
    """Paths (relative to root) of every file git tracks, or [] when git is not available."""
    try:
        out = subprocess.run(['git', '-C', root, 'ls-files', '-z'], check=True,
                             capture_output=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [p for p in out.decode('utf-8', 'surrogateescape').split('\0') if p]


class Tree:
    """Text of the files touched so far, read lazily and written back once."""

    def __init__(self, root, exclude):
        self.root = root
        self.exclude = exclude  # rel paths never searched (the map itself, this script)
        self.text = {}          # rel path -> current text (None: unreadable / not text)
        self.changed = set()
        self._tracked = None

    def get(self, rel):
        if rel not in self.text:
            path = os.path.join(self.root, rel)
            try:
                with open(path, encoding='utf-8', errors='surrogateescape', newline='') as f:
                    t = f.read()
                self.text[rel] = None if '\0' in t else t
            except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
                self.text[rel] = None
        return self.text[rel]

    def set(self, rel, t):
        self.text[rel] = t
        self.changed.add(rel)

    def find_elsewhere(self, old, skip):
        """Files other than `skip` holding `old`, with the number of occurrences in each."""
        if self._tracked is None:
            self._tracked = tracked_files(self.root)
        hits = []
        for rel in self._tracked:
            if rel == skip or rel in self.exclude:
                continue
            t = self.get(rel)
            if t is not None and old in t:
                hits.append((rel, t.count(old)))
        return hits

    def write(self):
        """Write every changed file: temp file in the same directory, fsync, rename; mode kept."""
        for rel in sorted(self.changed):
            path = os.path.join(self.root, rel)
            mode = os.stat(path).st_mode & 0o7777
            fd, tmp = tempfile.mkstemp(prefix='.cite.', dir=os.path.dirname(path) or '.')
            try:
                with os.fdopen(fd, 'w', encoding='utf-8', errors='surrogateescape', newline='') as f:
                    f.write(self.text[rel])
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, mode)
                os.replace(tmp, path)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise


def apply_entry(tree, entry):
    """Apply one entry to `tree`; returns (status, message), status 'ok' | 'moved' | 'done' | 'fail'."""
    n, rel, line, old, new = entry
    where = f'map line {n} ({rel}:{line})'
    t = tree.get(rel)
    count = t.count(old) if t is not None else 0
    if count == 1:
        tree.set(rel, t.replace(old, new, 1))
        return 'ok', f'{where}: replaced'
    if count > 1:
        return 'fail', f'{where}: old text found {count} times in {rel}, left alone: {old}'
    hits = tree.find_elsewhere(old, rel)
    if len(hits) == 1 and hits[0][1] == 1:
        other = hits[0][0]
        tree.set(other, tree.get(other).replace(old, new, 1))
        return 'moved', f'{where}: not in {rel}; replaced in {other}'
    if hits:
        places = ', '.join(f'{h} ({c}x)' for h, c in hits)
        return 'fail', f'{where}: not in {rel}; found in several places ({places}), left alone: {old}'
    if t is not None and new and new in t:
        return 'done', f'{where}: already applied'
    state = 'missing' if t is None else 'present'
    return 'fail', f'{where}: old text not found ({rel} {state}): {old}'


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description='Apply docs/.citation-map.txt (see the module doc).')
    ap.add_argument('--dry-run', action='store_true', help='report only, write nothing')
    ap.add_argument('--map', help='map file (default: docs/.citation-map.txt under --root)')
    ap.add_argument('--root', default=os.path.dirname(here), help='repository root')
    try:
        args = ap.parse_args(argv)
    except SystemExit as e:
        return 0 if e.code == 0 else 1
    map_path = args.map or os.path.join(args.root, 'docs', '.citation-map.txt')
    try:
        entries = parse_map(map_path)
    except MapError as e:
        print(f'apply_citation_map: {e}', file=sys.stderr)
        return 2
    except OSError as e:
        print(f'apply_citation_map: cannot read {map_path}: {e.strerror}', file=sys.stderr)
        return 4
    def rel_to_root(p):
        return os.path.relpath(os.path.abspath(p), os.path.abspath(args.root))
    tree = Tree(args.root, {rel_to_root(map_path), rel_to_root(__file__)})
    tally = {'ok': 0, 'moved': 0, 'done': 0, 'fail': 0}
    for e in entries:
        status, msg = apply_entry(tree, e)
        tally[status] += 1
        if status != 'ok':
            print(msg, file=sys.stderr if status == 'fail' else sys.stdout)
    verb = 'would change' if args.dry_run else 'changed'
    print(f'apply_citation_map: {len(entries)} entries: {tally["ok"]} in place, {tally["moved"]} moved, '
          f'{tally["done"]} already applied, {tally["fail"]} not found or ambiguous; '
          f'{verb} {len(tree.changed)} files')
    if not args.dry_run:
        try:
            tree.write()
        except OSError as e:
            print(f'apply_citation_map: write failed: {e}', file=sys.stderr)
            return 4
    return 5 if tally['fail'] else 0


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
