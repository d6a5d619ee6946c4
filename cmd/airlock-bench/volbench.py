# The volume benchmark's workload (cmd/airlock-bench, group "volumes"). The
# same script runs on the host (the baseline) and in guests, as
#   python3 -c SCRIPT DIR MIB FILES
# and prints one JSON object. Python 3 standard library only.
#
# - Sequential write: MIB MiB in 1 MiB writes to DIR/seq.bin, then fsync,
#   timed including the fsync.
# - Sequential read: the same file read back in 1 MiB reads, after
#   posix_fadvise(DONTNEED) asked this kernel to drop it from its page
#   cache. "resident" is the fraction of the file's pages this kernel still
#   had cached when the read began (mincore, through ctypes; null where that
#   is unavailable): it says whether the read was cold in this kernel, not
#   in the kernels below it. A second read ("reread") is warm by
#   construction.
# - Small files: FILES files of 4 KiB each created, written and closed in
#   DIR/small, then one fsync of that directory, timed.
import json
import os
import sys
import time

CHUNK = 1 << 20


def resident_fraction(fd, size):
    try:
        import ctypes
        import mmap

        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            return None
        try:
            pages = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return sum(b & 1 for b in vec) / pages
        finally:
            libc.munmap(addr, size)
    except Exception:
        return None


def read_all(path, size):
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(CHUNK)
        t = time.perf_counter()
        n = 0
        while True:
            k = os.readv(fd, [buf])
            if k == 0:
                break
            n += k
        d = time.perf_counter() - t
    finally:
        os.close(fd)
    if n != size:
        raise SystemExit("read %d bytes of %d" % (n, size))
    return d


def main():
    d, mib, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "seq.bin")
    size = mib * CHUNK
    block = os.urandom(CHUNK)

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        t = time.perf_counter()
        for _ in range(mib):
            view = memoryview(block)
            while view:
                view = view[os.write(fd, view):]
        os.fsync(fd)
        write_s = time.perf_counter() - t
    finally:
        os.close(fd)

    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            fadvise = "ok"
        except OSError as e:
            fadvise = "error: %s" % e.strerror
        resident = resident_fraction(fd, size)
    finally:
        os.close(fd)
    read_s = read_all(path, size)
    reread_s = read_all(path, size)
    os.unlink(path)

    small = os.path.join(d, "small")
    os.makedirs(small, exist_ok=True)
    data = os.urandom(4096)
    t = time.perf_counter()
    for i in range(files):
        with open(os.path.join(small, "f%05d" % i), "wb") as f:
            f.write(data)
    dfd = os.open(small, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    create_s = time.perf_counter() - t
    for i in range(files):
        os.unlink(os.path.join(small, "f%05d" % i))
    os.rmdir(small)

    print(json.dumps({
        "mib": mib,
        "files": files,
        "write_mbps": size / write_s / 1e6,
        "read_mbps": size / read_s / 1e6,
        "reread_mbps": size / reread_s / 1e6,
        "fadvise": fadvise,
        "resident": resident,
        "creates_per_s": files / create_s,
    }))


main()
