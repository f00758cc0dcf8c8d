# Times the `locus bench ops` rows against an XRootD server through its Python bindings
# (the C++ client underneath). Usage: xrootd_ops.py URL ITERATIONS BIG_FILE_BYTES
# Prints one JSON object: {"rows": {row: {mean, p50, p99}}, "read_mbps": x, "write_mbps": y}
import json, sys, time
from XRootD import client
from XRootD.client.flags import OpenFlags

url, iters, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fs = client.FileSystem(url)

def check(st):
    if not st.ok:
        raise SystemExit("xrootd: " + st.message)

def summary(samples):
    samples.sort()
    us = [s * 1e6 for s in samples]
    pick = lambda q: us[int(round((len(us) - 1) * q))]
    return {"mean": sum(us) / len(us), "p50": pick(0.5), "p99": pick(0.99)}

def timed(f):
    for _ in range(max(5, iters // 20)):
        f()
    out = []
    for _ in range(iters):
        t = time.perf_counter(); f(); out.append(time.perf_counter() - t)
    return summary(out)

rows = {}
rows["stat"] = timed(lambda: check(fs.stat("/small")[0]))

def open_close():
    f = client.File(); check(f.open(url + "//small", OpenFlags.READ)[0]); check(f.close()[0])
rows["open+close"] = timed(open_close)

rf = client.File(); check(rf.open(url + "//small", OpenFlags.READ)[0])
rows["read 1B"] = timed(lambda: check(rf.read(0, 1)[0]))
rows["read 8KB"] = timed(lambda: check(rf.read(0, 8192)[0]))
rf.close()

wf = client.File(); check(wf.open(url + "//wfile", OpenFlags.UPDATE | OpenFlags.DELETE)[0])
one, eight = b"x", b"y" * 8192
rows["write 1B"] = timed(lambda: check(wf.write(one, 0)[0]))
rows["write 8KB"] = timed(lambda: check(wf.write(eight, 0)[0]))
wf.close()

chunk = 8 << 20
bf = client.File(); check(bf.open(url + "//big", OpenFlags.READ)[0])
t = time.perf_counter(); off = 0
while off < size:
    st, data = bf.read(off, chunk); check(st); off += len(data)
    if not data: break
read_mbps = off / (time.perf_counter() - t) / 1e6
bf.close()

block = b"z" * chunk
wf = client.File(); check(wf.open(url + "//bigw", OpenFlags.UPDATE)[0])
t = time.perf_counter(); off = 0
while off < size:
    check(wf.write(block, off)[0]); off += chunk
check(wf.close()[0])
write_mbps = off / (time.perf_counter() - t) / 1e6

print(json.dumps({"rows": rows, "read_mbps": read_mbps, "write_mbps": write_mbps}))
