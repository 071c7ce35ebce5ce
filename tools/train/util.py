"""Small helpers shared by the tools/train scripts: logging to stdout and a log file, stage timing,
atomic file writes, tar archives split to a size limit, and imports of tools/fixtures."""
import io
import json
import os
import sys
import tarfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
FIXTURES = os.path.join(REPO, "tools", "fixtures")
if FIXTURES not in sys.path:
    sys.path.insert(0, FIXTURES)

_LOG = {"file": None, "t0": time.time()}


class CheckFailed(Exception):
    """A pipeline check failed: run_all stops with this message."""


def log_to(path):
    """Also append every log line to `path` (flushed per line, so a killed run keeps it)."""
    _LOG["file"] = open(path, "a", encoding="utf-8")


def log(*a):
    line = " ".join(str(x) for x in a)
    stamp = "[%7.1fs] " % (time.time() - _LOG["t0"])
    print(stamp + line, flush=True)
    if _LOG["file"]:
        _LOG["file"].write(stamp + line + "\n")
        _LOG["file"].flush()


def check(cond, msg):
    if not cond:
        raise CheckFailed(msg)


class Stage:
    """with Stage("train", times): ... logs start and end and records the seconds in times."""

    def __init__(self, name, times):
        self.name, self.times = name, times

    def __enter__(self):
        self.t = time.time()
        log("== stage %s" % self.name)
        return self

    def __exit__(self, typ, val, tb):
        dt = time.time() - self.t
        self.times[self.name] = round(dt, 2)
        log("== stage %s %s in %.1f s" % (self.name, "done" if typ is None else "FAILED", dt))
        return False


def write_bytes_atomic(path, data):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_json(path, obj):
    write_bytes_atomic(path, (json.dumps(obj, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))


def tar_gz(src_dir, arcname):
    """gzip'd tar of src_dir (entries sorted, mtime 0, owner 0) -> bytes."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tf:
        for root, dirs, files in os.walk(src_dir):
            dirs.sort()
            for fn in sorted(files):
                p = os.path.join(root, fn)
                ti = tf.gettarinfo(p, arcname=os.path.join(arcname, os.path.relpath(p, src_dir)))
                ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
                with open(p, "rb") as f:
                    tf.addfile(ti, f)
    return buf.getvalue()


def write_pieces(path, data, piece_bytes):
    """Write data as path (if it fits) or path.00, path.01, ... of at most piece_bytes each
    (join with `cat path.* > path`). Returns the file names written."""
    if len(data) <= piece_bytes:
        write_bytes_atomic(path, data)
        return [os.path.basename(path)]
    names = []
    for i in range(0, len(data), piece_bytes):
        p = "%s.%02d" % (path, i // piece_bytes)
        write_bytes_atomic(p, data[i:i + piece_bytes])
        names.append(os.path.basename(p))
    return names
