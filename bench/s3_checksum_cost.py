"""Run: LOCUS_BIN=target/release/locus target/s3-venv/bin/python bench/s3_checksum_cost.py

boto3 PutObject of 256 MiB (single request) and upload_file of 1 GiB (8 MiB parts),
with boto3's default CRC32 (checked by the door since this stop) and without any checksum
(request_checksum_calculation="when_required"), interleaved, medians of 3."""
import os, sys, time, statistics, pathlib, tempfile  # noqa: E401
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "crates/locus-s3/tests/clients"))
import conftest, boto3
from botocore.config import Config
from boto3.s3.transfer import TransferConfig
work = pathlib.Path(tempfile.mkdtemp())
facts, proc = conftest.start(work)
key, secret = facts["admin"]
def client(mode):
    return boto3.client("s3", endpoint_url=facts["endpoint"], aws_access_key_id=key, aws_secret_access_key=secret,
                        region_name="us-east-1", config=Config(signature_version="s3v4", s3={"addressing_style": "path"},
                        request_checksum_calculation=mode))
src = work / "big.bin"; src.write_bytes(os.urandom(1 << 30))
body = os.urandom(256 << 20)
res = {}
for r in range(3):
    for mode in ("when_supported", "when_required"):
        c = client(mode)
        t = time.perf_counter(); out = c.put_object(Bucket="shared", Key=f"one-{mode}", Body=body); a = time.perf_counter() - t
        assert ("ChecksumCRC32" in out) == (mode == "when_supported"), out.keys()
        os.sync()
        t = time.perf_counter(); c.upload_file(str(src), "shared", f"multi-{mode}", Config=TransferConfig(multipart_chunksize=8 << 20)); b = time.perf_counter() - t
        os.sync()
        res.setdefault(mode, []).append((a, b))
for mode, v in res.items():
    print(mode, "PUT 256 MiB median %.2f s" % statistics.median(x[0] for x in v), [round(x[0], 2) for x in v],
          "| upload_file 1 GiB median %.2f s" % statistics.median(x[1] for x in v), [round(x[1], 2) for x in v])
proc.terminate(); proc.wait()
