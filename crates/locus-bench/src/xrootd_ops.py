# A long-lived XRootD client for `locus bench ops`, driven over stdin so that every row
# can be measured right beside the other targets' (the machine's speed drifts).
# Usage: xrootd_ops.py URL. Commands, one per line:
#   row NAME ITERATIONS   -> [microseconds of each call]
#   bw BYTES              -> {"read_mbps": x, "write_mbps": y}
import json, sys, time
from XRootD import client
from XRootD.client.flags import OpenFlags

url = sys.argv[1]
fs = client.FileSystem(url)

def check(st):
    if not st.ok:
        raise SystemExit("xrootd: " + st.message)

def timed(f, iters):
    for _ in range(max(3, iters // 20)):
        f()
    out = []
    for _ in range(iters):
        t = time.perf_counter(); f(); out.append((time.perf_counter() - t) * 1e6)
    return out

def open_close():
    f = client.File(); check(f.open(url + "//small", OpenFlags.READ)[0]); check(f.close()[0])

rf = client.File(); check(rf.open(url + "//small", OpenFlags.READ)[0])
wf = client.File(); check(wf.open(url + "//wfile", OpenFlags.UPDATE | OpenFlags.NEW)[0])
one, eight = b"x", b"y" * 8192
rows = {
    "stat": lambda: check(fs.stat("/small")[0]),
    "open+close": open_close,
    "read 1B": lambda: check(rf.read(0, 1)[0]),
    "read 8KB": lambda: check(rf.read(0, 8192)[0]),
    "write 1B": lambda: check(wf.write(one, 0)[0]),
    "write 8KB": lambda: check(wf.write(eight, 0)[0]),
}

def bandwidth(size):
    chunk = 8 << 20
    bf = client.File(); check(bf.open(url + "//big", OpenFlags.READ)[0])
    t = time.perf_counter(); off = 0
    while off < size:
        st, data = bf.read(off, chunk); check(st)
        if not data: break
        off += len(data)
    read_mbps = off / (time.perf_counter() - t) / 1e6
    bf.close()
    block = b"z" * chunk
    w = client.File(); check(w.open(url + "//bigw", OpenFlags.UPDATE)[0])
    t = time.perf_counter(); off = 0
    while off < size:
        check(w.write(block, off)[0]); off += chunk
    check(w.close()[0])
    return {"read_mbps": read_mbps, "write_mbps": off / (time.perf_counter() - t) / 1e6}

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    parts = line.rsplit(None, 1)
    if line.startswith("row "):
        name, iters = line[4:].rsplit(None, 1)
        print(json.dumps(timed(rows[name], int(iters))), flush=True)
    elif line.startswith("bw "):
        print(json.dumps(bandwidth(int(line[3:]))), flush=True)
