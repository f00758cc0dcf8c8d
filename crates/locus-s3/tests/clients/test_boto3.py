"""boto3 against `locus serve --s3-port`: every operation the door offers, signed as S3
clients sign (headers, presigned URLs, aws-chunked bodies), and its refusals."""

import base64
import datetime
import hashlib
import os
import urllib.error
import urllib.request

import botocore
import pytest
from conftest import client


def code(e):
    return e.value.response["Error"]["Code"]


def status(e):
    return e.value.response["ResponseMetadata"]["HTTPStatusCode"]


def test_buckets_are_top_level_directories(server, s3):
    names = [b["Name"] for b in s3.list_buckets()["Buckets"]]
    assert "shared" in names and "private" in names
    s3.create_bucket(Bucket="made-by-s3")
    assert (server["root"] / "made-by-s3").is_dir()
    s3.head_bucket(Bucket="made-by-s3")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.create_bucket(Bucket="made-by-s3")
    assert code(e) == "BucketAlreadyOwnedByYou"
    s3.put_object(Bucket="made-by-s3", Key="x", Body=b"1")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.delete_bucket(Bucket="made-by-s3")
    assert code(e) == "BucketNotEmpty"
    s3.delete_object(Bucket="made-by-s3", Key="x")
    s3.delete_bucket(Bucket="made-by-s3")
    assert not (server["root"] / "made-by-s3").exists()
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_bucket(Bucket="made-by-s3")
    assert status(e) == 404
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.list_objects_v2(Bucket="no-such-bucket")
    assert code(e) == "NoSuchBucket"


def test_put_get_head_are_the_exports_files(server, s3, bucket):
    body = os.urandom(300_000)
    r = s3.put_object(Bucket=bucket, Key="dir/sub/data.bin", Body=body, ContentType="application/x-test",
                      Metadata={"owner": "alice", "run": "7"})
    assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
    assert (server["root"] / bucket / "dir/sub/data.bin").read_bytes() == body
    got = s3.get_object(Bucket=bucket, Key="dir/sub/data.bin")
    assert got["Body"].read() == body
    assert got["ETag"] == r["ETag"]
    assert got["ContentType"] == "application/x-test"
    assert got["Metadata"] == {"owner": "alice", "run": "7"}
    head = s3.head_object(Bucket=bucket, Key="dir/sub/data.bin")
    assert head["ContentLength"] == len(body) and head["ETag"] == r["ETag"]
    # A file written beside the door is an object too.
    (server["root"] / bucket / "beside.txt").write_text("written by another door")
    assert s3.get_object(Bucket=bucket, Key="beside.txt")["Body"].read() == b"written by another door"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="missing")
    assert code(e) == "NoSuchKey"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="dir")
    assert code(e) == "NoSuchKey"


def test_ranges_and_conditions(s3, bucket):
    body = bytes(range(256)) * 100
    etag = s3.put_object(Bucket=bucket, Key="r", Body=body)["ETag"]
    got = s3.get_object(Bucket=bucket, Key="r", Range="bytes=10-19")
    assert got["Body"].read() == body[10:20]
    assert got["ContentRange"] == "bytes 10-19/%d" % len(body)
    assert s3.get_object(Bucket=bucket, Key="r", Range="bytes=-5")["Body"].read() == body[-5:]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", Range="bytes=999999-")
    assert status(e) == 416
    assert s3.get_object(Bucket=bucket, Key="r", IfMatch=etag)["Body"].read() == body
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", IfMatch='"0000"')
    assert status(e) == 412
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", IfNoneMatch=etag)
    assert status(e) == 304
    future = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(days=1)
    past = datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", IfModifiedSince=future)
    assert status(e) == 304
    assert s3.get_object(Bucket=bucket, Key="r", IfModifiedSince=past)["Body"].read() == body
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket=bucket, Key="r", IfUnmodifiedSince=past)
    assert status(e) == 412
    # Create-only writes.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="r", Body=b"x", IfNoneMatch="*")
    assert status(e) == 412
    s3.put_object(Bucket=bucket, Key="r-new", Body=b"x", IfNoneMatch="*")


def test_content_md5_is_checked_and_nothing_shows_on_mismatch(server, s3, bucket):
    good = base64.b64encode(hashlib.md5(b"right").digest()).decode()
    s3.put_object(Bucket=bucket, Key="m", Body=b"right", ContentMD5=good)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="m", Body=b"wrong", ContentMD5=good)
    assert code(e) == "BadDigest"
    assert s3.get_object(Bucket=bucket, Key="m")["Body"].read() == b"right"
    assert sorted(p.name for p in (server["root"] / bucket).iterdir()) == ["m"]


def signed_request(server, method, path, headers, body=b""):
    """A request signed as the admin, as botocore signs (the payload hash as given in
    x-amz-content-sha256); answers the URL and the headers to send."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    req = AWSRequest(method=method, url=f"{server['endpoint']}{path}", data=body, headers=headers)
    SigV4Auth(Credentials(*server["admin"]), "s3", "us-east-1").add_auth(req)
    p = req.prepare()
    return p.url, dict(p.headers)


def begun_request(server, method, path, headers, timeout=30):
    """A connection on which a request signed as `signed_request` signs it has sent its
    headers, and none of its body: the caller sends the body, when and as it likes."""
    import http.client
    import urllib.parse

    url, headers = signed_request(server, method, path, headers)
    at = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(at.hostname, at.port, timeout=timeout)
    conn.putrequest(method, f"{at.path}?{at.query}" if at.query else at.path, skip_accept_encoding=True)
    for k, v in headers.items():
        if k.lower() != "host":
            conn.putheader(k, v)
    conn.endheaders()
    return conn


def part_begun(server, uid, number):
    """The directory of upload UID, once part NUMBER has taken its place in the upload's
    assembly file."""
    import time

    upload_dir = server["state"] / "s3-uploads" / uid
    deadline = time.time() + 10
    while not (upload_dir / f"{number}.slot").exists():
        assert time.time() < deadline, f"part {number} never began: {sorted(p.name for p in upload_dir.iterdir())}"
        time.sleep(0.05)
    return upload_dir


def test_a_part_whose_client_goes_mid_body_is_not_listed_and_may_be_sent_again(server, s3, bucket):
    import time

    uid = s3.create_multipart_upload(Bucket=bucket, Key="gone")["UploadId"]
    conn = begun_request(server, "PUT", f"/{bucket}/gone?partNumber=1&uploadId={uid}", {
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "content-length": str(8 << 20)})
    conn.send(os.urandom(2 << 20))
    # Part 1 fixes the upload's stride and is written in place, in its assembly file.
    upload_dir = part_begun(server, uid, 1)
    conn.sock.close()  # the client goes, half its part sent
    # Its writer ends (it held the assembly file under a shared lock).
    import fcntl
    with open(upload_dir / "data", "rb") as data:
        deadline = time.time() + 10
        while True:
            try:
                fcntl.flock(data, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                assert time.time() < deadline, "the part's writer never ended"
                time.sleep(0.05)
        fcntl.flock(data, fcntl.LOCK_UN)
    assert not any(".tmp" in p.name for p in upload_dir.iterdir()), sorted(p.name for p in upload_dir.iterdir())
    assert s3.list_parts(Bucket=bucket, Key="gone", UploadId=uid).get("Parts", []) == []
    # Sent again, the part goes to a file of its own (its place was taken once), and
    # the object is what was sent.
    first, last = os.urandom(8 << 20), b"the end"
    e1 = s3.upload_part(Bucket=bucket, Key="gone", UploadId=uid, PartNumber=1, Body=first)["ETag"]
    e2 = s3.upload_part(Bucket=bucket, Key="gone", UploadId=uid, PartNumber=2, Body=last)["ETag"]
    assert any(p.name.startswith("1.") and len(p.name) == 34 for p in upload_dir.iterdir())
    s3.complete_multipart_upload(Bucket=bucket, Key="gone", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": 1, "ETag": e1}, {"PartNumber": 2, "ETag": e2}]})
    assert s3.get_object(Bucket=bucket, Key="gone")["Body"].read() == first + last


def test_a_completion_waits_for_a_part_being_written_in_place(server, s3, bucket):
    # Part 2 is being written into the upload's assembly file when a completion of part
    # 1 alone comes: the completion waits for that writer, so no byte of part 2 lands in
    # the object once it shows (it would have grown past part 1's end), and part 2's
    # request finds its upload gone.
    import threading
    import time

    first = os.urandom(5 << 20)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="waited")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="waited", UploadId=uid, PartNumber=1, Body=first)["ETag"]
    conn = begun_request(server, "PUT", f"/{bucket}/waited?partNumber=2&uploadId={uid}", {
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "content-length": str(5 << 20)})
    conn.send(os.urandom(1 << 20))
    part_begun(server, uid, 2)
    time.sleep(0.2)  # its writer holds the assembly file
    done = []
    completing = threading.Thread(target=lambda: done.append(s3.complete_multipart_upload(
        Bucket=bucket, Key="waited", UploadId=uid, MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": e1}]})))
    completing.start()
    time.sleep(1)
    assert not done, "the completion did not wait for the part being written"
    conn.send(os.urandom(4 << 20))
    answer = conn.getresponse()
    assert answer.status == 404 and b"NoSuchUpload" in answer.read()
    completing.join(30)
    assert done, "the completion never ended"
    assert s3.get_object(Bucket=bucket, Key="waited")["Body"].read() == first
    assert (server["root"] / bucket / "waited").stat().st_size == 5 << 20


def test_a_part_longer_than_it_declared_writes_nothing_past_its_place(server, s3, bucket):
    # Part 2 declares 5 MiB decoded in an aws-chunked body and sends 10 MiB: refused,
    # and part 3, already placed after it in the assembly file, stays whole.
    import base64
    import zlib

    mib5 = 5 << 20
    uid = s3.create_multipart_upload(Bucket=bucket, Key="overrun")["UploadId"]
    p1, p3, p4 = os.urandom(mib5), os.urandom(mib5), b"tail"
    tags = {n: s3.upload_part(Bucket=bucket, Key="overrun", UploadId=uid, PartNumber=n, Body=b)["ETag"]
            for n, b in ((1, p1), (3, p3), (4, p4))}
    payload = b"\xaa" * (2 * mib5)
    crc = base64.b64encode(zlib.crc32(payload).to_bytes(4, "big")).decode()
    body = b"".join(b"%x\r\n" % len(payload[i:i + (1 << 20)]) + payload[i:i + (1 << 20)] + b"\r\n"
                    for i in range(0, len(payload), 1 << 20))
    body += b"0\r\n" + f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    conn = begun_request(server, "PUT", f"/{bucket}/overrun?partNumber=2&uploadId={uid}", {
        "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "content-encoding": "aws-chunked",
        "x-amz-trailer": "x-amz-checksum-crc32", "x-amz-decoded-content-length": str(mib5),
        "content-length": str(len(body))})
    conn.send(body)
    answer = conn.getresponse()
    assert answer.status == 400, answer.read()
    p2 = os.urandom(mib5)
    tags[2] = s3.upload_part(Bucket=bucket, Key="overrun", UploadId=uid, PartNumber=2, Body=p2)["ETag"]
    s3.complete_multipart_upload(Bucket=bucket, Key="overrun", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": tags[n]} for n in (1, 2, 3, 4)]})
    assert s3.get_object(Bucket=bucket, Key="overrun")["Body"].read() == p1 + p2 + p3 + p4


def test_sends_of_one_part_at_once_keep_one(server, s3, bucket):
    # Each part number sent twice at once, the same bytes (a client's retry racing its
    # first try): one placed, one in a file of its own; one of them is always kept.
    import threading

    other = client(server)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="twice")["UploadId"]
    s3.upload_part(Bucket=bucket, Key="twice", UploadId=uid, PartNumber=1, Body=os.urandom(5 << 20))
    for n in range(2, 42):
        body, start = os.urandom(64 << 10), threading.Barrier(2)

        def send(c, n=n, body=body, start=start):
            start.wait()
            c.upload_part(Bucket=bucket, Key="twice", UploadId=uid, PartNumber=n, Body=body)

        both = [threading.Thread(target=send, args=(c,)) for c in (s3, other)]
        [t.start() for t in both]
        [t.join() for t in both]
    listed = s3.list_parts(Bucket=bucket, Key="twice", UploadId=uid, MaxParts=1000)["Parts"]
    assert [p["PartNumber"] for p in listed] == list(range(1, 42))
    s3.abort_multipart_upload(Bucket=bucket, Key="twice", UploadId=uid)


def test_a_completion_waits_a_minute_at_most_for_a_part_sent_slowly(server, s3, bucket):
    # Part 2 trickles in (a byte every few seconds, never silent long enough to time
    # out): a completion gives up after 60 s with SlowDown and gives the upload back;
    # once that part's client is gone, the upload completes.
    import threading
    import time

    first = os.urandom(5 << 20)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="slow")["UploadId"]
    e1 = s3.upload_part(Bucket=bucket, Key="slow", UploadId=uid, PartNumber=1, Body=first)["ETag"]
    conn = begun_request(server, "PUT", f"/{bucket}/slow?partNumber=2&uploadId={uid}", {
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "content-length": str(1 << 20)}, timeout=120)
    stop = threading.Event()

    def trickle():
        while not stop.wait(3):
            conn.send(b"x")

    conn.send(b"x")
    trickling = threading.Thread(target=trickle)
    trickling.start()
    try:
        part_begun(server, uid, 2)
        time.sleep(0.2)
        parts = {"Parts": [{"PartNumber": 1, "ETag": e1}]}
        # Sent once, not retried as boto3 retries a SlowDown.
        xml = f"<CompleteMultipartUpload><Part><PartNumber>1</PartNumber><ETag>{e1}</ETag></Part>" \
              "</CompleteMultipartUpload>".encode()
        url, headers = signed_request(server, "POST", f"/{bucket}/slow?uploadId={uid}", {
            "x-amz-content-sha256": hashlib.sha256(xml).hexdigest()}, xml)
        began = time.time()
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(url, data=xml, headers=headers, method="POST"), timeout=120)
        said = e.value.read()
        assert e.value.code == 503 and b"SlowDown" in said and 55 < time.time() - began < 90, (said, time.time() - began)
        assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]
    finally:
        stop.set()
        trickling.join()
        conn.sock.close()
    # The trickling part's writer ends with its client; the upload completes.
    deadline = time.time() + 10
    while True:
        try:
            s3.complete_multipart_upload(Bucket=bucket, Key="slow", UploadId=uid, MultipartUpload=parts)
            break
        except botocore.exceptions.ClientError as e:
            assert code(e) == "SlowDown" and time.time() < deadline, code(e)
    assert s3.get_object(Bucket=bucket, Key="slow")["Body"].read() == first


def test_create_only_puts_race_and_one_wins(server, s3, bucket):
    # A create-only PUT begins (its upload is under way at the server, half its bytes
    # sent); another client makes the key meanwhile; the first PUT's end finds the key
    # taken: 412, and the other's object stays whole.
    import time

    body = os.urandom(4 << 20)
    conn = begun_request(server, "PUT", f"/{bucket}/raced", {
        "x-amz-content-sha256": "UNSIGNED-PAYLOAD", "if-none-match": "*", "content-length": str(len(body))})
    conn.send(body[: len(body) // 2])
    time.sleep(0.5)
    s3.put_object(Bucket=bucket, Key="raced", Body=b"theirs")
    conn.send(body[len(body) // 2:])
    answer = conn.getresponse()
    said = answer.read()
    assert answer.status == 412 and b"PreconditionFailed" in said, said
    assert s3.get_object(Bucket=bucket, Key="raced")["Body"].read() == b"theirs"
    assert sorted(p.name for p in (server["root"] / bucket).iterdir()) == ["raced"]


def test_a_create_only_completion_leaves_a_taken_key_and_its_upload(server, s3, bucket):
    data = os.urandom(5 << 20)  # placed in its upload's assembly file
    uid = s3.create_multipart_upload(Bucket=bucket, Key="done")["UploadId"]
    tag = s3.upload_part(Bucket=bucket, Key="done", UploadId=uid, PartNumber=1, Body=data)["ETag"]
    s3.put_object(Bucket=bucket, Key="done", Body=b"made meanwhile")
    parts = {"Parts": [{"PartNumber": 1, "ETag": tag}]}
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="done", UploadId=uid, MultipartUpload=parts, IfNoneMatch="*")
    assert status(e) == 412
    assert s3.get_object(Bucket=bucket, Key="done")["Body"].read() == b"made meanwhile"
    # The upload is given back: once the key is free, it completes.
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="done", UploadId=uid, MultipartUpload=parts, IfMatch='"x"')
    assert code(e) == "NotImplemented"
    s3.delete_object(Bucket=bucket, Key="done")
    s3.complete_multipart_upload(Bucket=bucket, Key="done", UploadId=uid, MultipartUpload=parts, IfNoneMatch="*")
    assert s3.get_object(Bucket=bucket, Key="done")["Body"].read() == data


HELLO_CRC32 = "DUoRhQ=="  # the CRC32 of b"hello world", base64 (as the SDKs send it)


def test_checksums_sent_beside_bodies_are_checked(server, s3, bucket):
    # In a header: checked, given back; a mismatch is BadDigest and nothing shows.
    out = s3.put_object(Bucket=bucket, Key="c", Body=b"hello world", ChecksumCRC32=HELLO_CRC32)
    assert out["ChecksumCRC32"] == HELLO_CRC32
    out = s3.put_object(Bucket=bucket, Key="s", Body=b"hello world", ChecksumAlgorithm="SHA256")
    assert out["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(b"hello world").digest()).decode()
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="c", Body=b"hello worle", ChecksumCRC32=HELLO_CRC32)
    assert code(e) == "BadDigest"
    assert s3.get_object(Bucket=bucket, Key="c")["Body"].read() == b"hello world"
    # A part too: refused, and not among the parts.
    uid = s3.create_multipart_upload(Bucket=bucket, Key="p", ChecksumAlgorithm="CRC32")["UploadId"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=1, Body=b"hello worle",
                       ChecksumCRC32=HELLO_CRC32)
    assert code(e) == "BadDigest"
    assert s3.list_parts(Bucket=bucket, Key="p", UploadId=uid).get("Parts", []) == []
    good = s3.upload_part(Bucket=bucket, Key="p", UploadId=uid, PartNumber=1, Body=b"hello world",
                          ChecksumCRC32=HELLO_CRC32)
    assert good["ChecksumCRC32"] == HELLO_CRC32
    s3.abort_multipart_upload(Bucket=bucket, Key="p", UploadId=uid)

    # In the trailer of an aws-chunked body whose payload is unsigned (what SDKs send
    # over HTTPS): the checksum is the only check of the bytes, so a lying one is refused.
    def chunked(key, data, trailer):
        body = b"%x\r\n%s\r\n0\r\n%s\r\n\r\n" % (len(data), data, trailer)
        url, headers = signed_request(server, "PUT", f"/{bucket}/{key}", {
            "x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER", "content-encoding": "aws-chunked",
            "x-amz-decoded-content-length": str(len(data)), "x-amz-trailer": "x-amz-checksum-crc32",
            "content-length": str(len(body))}, body)
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body, headers=headers, method="PUT")) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    assert chunked("t", b"hello world", b"x-amz-checksum-crc32:" + HELLO_CRC32.encode())[0] == 200
    assert s3.get_object(Bucket=bucket, Key="t")["Body"].read() == b"hello world"
    st, said = chunked("t", b"hello worle", b"x-amz-checksum-crc32:" + HELLO_CRC32.encode())
    assert st == 400 and b"BadDigest" in said, said
    st, said = chunked("t", b"hello worle", b"x-amz-checksum-nothing:x")
    assert st == 400 and b"IncompleteBody" in said, said
    assert s3.get_object(Bucket=bucket, Key="t")["Body"].read() == b"hello world"


def test_listing_in_s3_order_with_prefix_delimiter_and_pages(s3, bucket):
    keys = ["a.txt", "a/b/c", "a/b/d", "a/e", "a0", "b", "c/x y+z&é.txt", "d/"]
    for k in keys:
        s3.put_object(Bucket=bucket, Key=k, Body=b"" if k.endswith("/") else k.encode())
    listed = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert listed == sorted(keys, key=lambda k: k.encode())
    r = s3.list_objects_v2(Bucket=bucket, Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a.txt", "a0", "b"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/", "c/", "d/"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="a/", Delimiter="/")
    assert [o["Key"] for o in r["Contents"]] == ["a/e"]
    assert [p["Prefix"] for p in r["CommonPrefixes"]] == ["a/b/"]
    r = s3.list_objects_v2(Bucket=bucket, Prefix="a/b")
    assert [o["Key"] for o in r["Contents"]] == ["a/b/c", "a/b/d"]
    r = s3.list_objects_v2(Bucket=bucket, StartAfter="a/b/c")
    assert [o["Key"] for o in r["Contents"]] == ["a/b/d", "a/e", "a0", "b", "c/x y+z&é.txt", "d/"]
    # Pages of two, through continuation tokens and the paginator, and through V1 markers.
    paged = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, PaginationConfig={"PageSize": 2}):
        assert page["KeyCount"] <= 2
        paged += [o["Key"] for o in page.get("Contents", [])]
    assert paged == listed
    v1 = []
    for page in s3.get_paginator("list_objects").paginate(Bucket=bucket, PaginationConfig={"PageSize": 3}):
        v1 += [o["Key"] for o in page.get("Contents", [])]
    assert v1 == listed
    prefixes = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Delimiter="/",
                                                            PaginationConfig={"PageSize": 1}):
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
    assert prefixes == ["a/", "c/", "d/"]


def test_delete_and_delete_objects(server, s3, bucket):
    for k in ["x/1", "x/2", "y"]:
        s3.put_object(Bucket=bucket, Key=k, Body=b"1")
    s3.delete_object(Bucket=bucket, Key="y")
    s3.delete_object(Bucket=bucket, Key="never-was")  # S3: no error
    r = s3.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": "x/1"}, {"Key": "x/2"}, {"Key": "../escape"}]})
    assert sorted(d["Key"] for d in r["Deleted"]) == ["x/1", "x/2"]
    assert [(e["Key"], e["Code"]) for e in r["Errors"]] == [("../escape", "InvalidArgument")]
    # The directory the keys left empty goes with them, as a prefix does in S3.
    assert list((server["root"] / bucket).iterdir()) == []


def test_copy_object_is_server_side(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="src", Body=b"copied bytes", ContentType="text/plain", Metadata={"k": "v"})
    r = s3.copy_object(Bucket=bucket, Key="deep/dst", CopySource={"Bucket": bucket, "Key": "src"})
    assert r["CopyObjectResult"]["ETag"] == '"%s"' % hashlib.md5(b"copied bytes").hexdigest()
    got = s3.get_object(Bucket=bucket, Key="deep/dst")
    assert got["Body"].read() == b"copied bytes" and got["Metadata"] == {"k": "v"}
    s3.copy_object(Bucket="shared", Key="from-other-bucket", CopySource={"Bucket": bucket, "Key": "src"},
                   MetadataDirective="REPLACE", Metadata={"new": "1"}, ContentType="text/x-new")
    got = s3.head_object(Bucket="shared", Key="from-other-bucket")
    assert got["Metadata"] == {"new": "1"} and got["ContentType"] == "text/x-new"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.copy_object(Bucket=bucket, Key="d", CopySource={"Bucket": bucket, "Key": "nope"})
    assert code(e) == "NoSuchKey"


def test_parts_of_any_order_and_size_assemble_in_order(server, s3, bucket):
    def upload(key, sizes, order):
        uid = s3.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
        data = {n: os.urandom(size) for n, size in enumerate(sizes, 1)}
        tags = {n: s3.upload_part(Bucket=bucket, Key=key, UploadId=uid, PartNumber=n, Body=data[n])["ETag"]
                for n in order}
        return uid, data, tags

    def complete(key, uid, tags, numbers):
        s3.complete_multipart_upload(Bucket=bucket, Key=key, UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": n, "ETag": tags[n]} for n in numbers]})

    # The last part first (too small to fix the stride: a file of its own), then part 2
    # (which fixes it at 6 MiB), then part 1: all lie in place but the last, which is
    # copied to its place; the assembly file becomes the object.
    uid, data, tags = upload("backwards", [6 << 20, 6 << 20, 1234], [3, 2, 1])
    assembly = (server["state"] / "s3-uploads" / uid / "data").stat().st_ino
    complete("backwards", uid, tags, [1, 2, 3])
    assert (server["root"] / bucket / "backwards").read_bytes() == data[1] + data[2] + data[3]
    assert (server["root"] / bucket / "backwards").stat().st_ino == assembly
    # A part larger than the stride (a file of its own) shifts the later ones from their
    # places: every part is copied in order instead. A part sent again, likewise.
    uid, data, tags = upload("uneven", [5 << 20, 7 << 20, 5 << 20, 99], [1, 2, 3, 4])
    data[3] = os.urandom(5 << 20)
    tags[3] = s3.upload_part(Bucket=bucket, Key="uneven", UploadId=uid, PartNumber=3, Body=data[3])["ETag"]
    listed = s3.list_parts(Bucket=bucket, Key="uneven", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"], p["ETag"]) for p in listed] == [
        (n, len(data[n]), tags[n]) for n in (1, 2, 3, 4)]
    assembly = (server["state"] / "s3-uploads" / uid / "data").stat().st_ino
    complete("uneven", uid, tags, [1, 2, 3, 4])
    assert s3.get_object(Bucket=bucket, Key="uneven")["Body"].read() == data[1] + data[2] + data[3] + data[4]
    assert (server["root"] / bucket / "uneven").stat().st_ino != assembly, "copied, not taken in place"
    # Parts chosen with gaps: those after a gap are out of place, and copied.
    uid, data, tags = upload("gaps", [5 << 20, 5 << 20, 5 << 20], [1, 2, 3])
    assembly = (server["state"] / "s3-uploads" / uid / "data").stat().st_ino
    complete("gaps", uid, tags, [1, 3])
    assert s3.get_object(Bucket=bucket, Key="gaps")["Body"].read() == data[1] + data[3]
    assert (server["root"] / bucket / "gaps").stat().st_ino != assembly, "copied, not taken in place"
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_multipart_upload_of_three_parts(server, s3, bucket):
    part = 5 << 20
    parts_data = [os.urandom(part), os.urandom(part), os.urandom(1234)]
    up = s3.create_multipart_upload(Bucket=bucket, Key="big/object", ContentType="application/x-big",
                                    Metadata={"parts": "3"})
    uid = up["UploadId"]
    assert [u["UploadId"] for u in s3.list_multipart_uploads(Bucket=bucket)["Uploads"]] == [uid]
    etags = []
    for n, data in enumerate(parts_data, 1):
        etags.append(s3.upload_part(Bucket=bucket, Key="big/object", UploadId=uid, PartNumber=n, Body=data)["ETag"])
    listed = s3.list_parts(Bucket=bucket, Key="big/object", UploadId=uid)["Parts"]
    assert [(p["PartNumber"], p["Size"]) for p in listed] == [(1, part), (2, part), (3, 1234)]
    # Parts are never visible under the key until complete.
    assert not (server["root"] / bucket / "big").exists()
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.head_object(Bucket=bucket, Key="big/object")
    assert status(e) == 404
    # Every part lies where it belongs in the upload's assembly file, which becomes
    # the object without a copy.
    assembly = (server["state"] / "s3-uploads" / uid / "data").stat().st_ino
    done = s3.complete_multipart_upload(
        Bucket=bucket, Key="big/object", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(etags, 1)]})
    assert (server["root"] / bucket / "big/object").stat().st_ino == assembly
    md5s = b"".join(hashlib.md5(d).digest() for d in parts_data)
    assert done["ETag"] == '"%s-3"' % hashlib.md5(md5s).hexdigest()
    whole = b"".join(parts_data)
    got = s3.get_object(Bucket=bucket, Key="big/object")
    assert got["Body"].read() == whole and got["ETag"] == done["ETag"] and got["Metadata"] == {"parts": "3"}
    assert (server["root"] / bucket / "big/object").read_bytes() == whole
    assert s3.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    # boto3's own transfer manager splits and completes by itself.
    from boto3.s3.transfer import TransferConfig
    src = server["work"] / "upload.bin"
    src.write_bytes(os.urandom(12 << 20))
    s3.upload_file(str(src), bucket, "managed.bin", Config=TransferConfig(multipart_threshold=5 << 20,
                                                                          multipart_chunksize=5 << 20))
    dst = server["work"] / "download.bin"
    s3.download_file(bucket, "managed.bin", str(dst), Config=TransferConfig(multipart_threshold=5 << 20,
                                                                              multipart_chunksize=5 << 20))
    assert dst.read_bytes() == src.read_bytes()


def test_upload_part_copy_takes_ranges_of_another_object(server, s3, bucket):
    src = os.urandom((5 << 20) + 4321)
    s3.put_object(Bucket=bucket, Key="src", Body=src)
    uid = s3.create_multipart_upload(Bucket=bucket, Key="assembled")["UploadId"]
    first = s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=1,
                                CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes=0-{(5 << 20) - 1}")
    second = s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=2,
                                 CopySource={"Bucket": bucket, "Key": "src"})  # all of it
    third = s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=3,
                                CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=f"bytes={5 << 20}-{len(src) - 1}")
    tags = [p["CopyPartResult"]["ETag"] for p in (first, second, third)]
    assert tags[0] == '"%s"' % hashlib.md5(src[: 5 << 20]).hexdigest()
    for bad in (f"bytes=0-{len(src)}", "bytes=10-5", "rows=0-1"):
        with pytest.raises(botocore.exceptions.ClientError) as e:
            s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=4,
                                CopySource={"Bucket": bucket, "Key": "src"}, CopySourceRange=bad)
        assert code(e) == "InvalidArgument", bad
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.upload_part_copy(Bucket=bucket, Key="assembled", UploadId=uid, PartNumber=4,
                            CopySource={"Bucket": bucket, "Key": "src"}, CopySourceIfMatch='"not-its-etag"')
    assert status(e) == 412
    s3.complete_multipart_upload(Bucket=bucket, Key="assembled", UploadId=uid, MultipartUpload={
        "Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(tags, 1)]})
    assert s3.get_object(Bucket=bucket, Key="assembled")["Body"].read() == src[: 5 << 20] + src + src[5 << 20:]
    # A subject that may not read the source gets no part of it.
    alice = client(server, "alice")
    uid = alice.create_multipart_upload(Bucket="shared", Key="hers")["UploadId"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.upload_part_copy(Bucket="shared", Key="hers", UploadId=uid, PartNumber=1,
                               CopySource={"Bucket": bucket, "Key": "src"})
    assert code(e) == "AccessDenied"
    assert alice.list_parts(Bucket="shared", Key="hers", UploadId=uid).get("Parts", []) == []
    alice.abort_multipart_upload(Bucket="shared", Key="hers", UploadId=uid)


def test_multipart_refusals_and_abort(server, s3, bucket):
    uid = s3.create_multipart_upload(Bucket=bucket, Key="k")["UploadId"]
    t1 = s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=1, Body=b"small")["ETag"]
    t2 = s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=2, Body=b"last")["ETag"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": t1}, {"PartNumber": 2, "ETag": t2}]})
    assert code(e) == "EntityTooSmall"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 2, "ETag": t2}, {"PartNumber": 1, "ETag": t1}]})
    assert code(e) == "InvalidPartOrder"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.complete_multipart_upload(Bucket=bucket, Key="k", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": '"%s"' % ("0" * 32)}]})
    assert code(e) == "InvalidPart"
    s3.abort_multipart_upload(Bucket=bucket, Key="k", UploadId=uid)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="k", UploadId=uid, PartNumber=3, Body=b"x")
    assert code(e) == "NoSuchUpload"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.upload_part(Bucket=bucket, Key="k", UploadId="../../../etc", PartNumber=1, Body=b"x")
    assert code(e) == "NoSuchUpload"
    assert not (server["root"] / bucket / "k").exists()


def test_a_completion_claims_its_upload(server, s3, bucket):
    """Two completions and an abort of one upload at once: exactly one completion wins,
    the others find no upload (never an internal error), and the object is whole."""
    import concurrent.futures
    parts = [os.urandom(5 << 20) for _ in range(3)]
    uid = s3.create_multipart_upload(Bucket=bucket, Key="raced")["UploadId"]
    tags = [s3.upload_part(Bucket=bucket, Key="raced", UploadId=uid, PartNumber=n, Body=p)["ETag"]
            for n, p in enumerate(parts, 1)]
    done = {"Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(tags, 1)]}
    racer = client(server, max_pool_connections=4)

    def attempt(what):
        try:
            if what == "abort":
                racer.abort_multipart_upload(Bucket=bucket, Key="raced", UploadId=uid)
            else:
                racer.complete_multipart_upload(Bucket=bucket, Key="raced", UploadId=uid, MultipartUpload=done)
            return "ok"
        except botocore.exceptions.ClientError as e:
            return e.response["Error"]["Code"]

    with concurrent.futures.ThreadPoolExecutor(3) as ex:
        outcomes = list(ex.map(attempt, ["complete", "complete", "abort"]))
    assert set(outcomes) <= {"ok", "NoSuchUpload"}, outcomes
    assert outcomes.count("ok") == 1, outcomes
    if outcomes[2] == "ok":  # the abort won: nothing shows
        assert not (server["root"] / bucket / "raced").exists()
    else:
        assert (server["root"] / bucket / "raced").read_bytes() == b"".join(parts)
    assert not list((server["state"] / "s3-uploads").iterdir())


def test_presigned_get_and_put_and_their_expiry(s3, bucket):
    put_url = s3.generate_presigned_url("put_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60)
    req = urllib.request.Request(put_url, data=b"sent with a presigned URL", method="PUT")
    assert urllib.request.urlopen(req).status == 200
    get_url = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=60)
    assert urllib.request.urlopen(get_url).read() == b"sent with a presigned URL"
    tampered = get_url.replace("Key=p", "").replace("/p?", "/q?")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(tampered)
    assert e.value.code == 403
    expired = s3.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": "p"}, ExpiresIn=1)
    import time
    time.sleep(2.5)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(expired)
    assert e.value.code == 403 and b"AccessDenied" in e.value.read()


def test_unsigned_and_wrong_secrets_are_refused(server):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server["endpoint"] + "/shared/hello.txt")
    assert e.value.code == 403
    wrong = dict(server, alice=("alice", "0" * 40))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        client(wrong, "alice").get_object(Bucket="shared", Key="hello.txt")
    assert code(e) == "SignatureDoesNotMatch"
    nobody = dict(server, alice=("mallory", "0" * 40))
    with pytest.raises(botocore.exceptions.ClientError) as e:
        client(nobody, "alice").list_buckets()
    assert code(e) == "InvalidAccessKeyId"


def test_acls_hold_for_s3_subjects(server, s3):
    alice = client(server, "alice")
    assert alice.get_object(Bucket="shared", Key="hello.txt")["Body"].read() == b"hello from the export\n"
    alice.put_object(Bucket="shared", Key="by-alice", Body=b"mine")
    s3.put_object(Bucket="private", Key="secret", Body=b"admin only")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.get_object(Bucket="private", Key="secret")
    assert code(e) == "AccessDenied"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.put_object(Bucket="private", Key="intrusion", Body=b"x")
    assert code(e) == "AccessDenied"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.list_objects_v2(Bucket="private")
    assert code(e) == "AccessDenied"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.create_multipart_upload(Bucket="private", Key="big")
    assert code(e) == "AccessDenied"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.copy_object(Bucket="shared", Key="stolen", CopySource={"Bucket": "private", "Key": "secret"})
    assert code(e) == "AccessDenied"
    assert not (server["root"] / "private" / "intrusion").exists()
    assert not (server["root"] / "shared" / "stolen").exists()
    # Another subject's upload is not hers to touch.
    uid = s3.create_multipart_upload(Bucket="shared", Key="admins")["UploadId"]
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.upload_part(Bucket="shared", Key="admins", UploadId=uid, PartNumber=1, Body=b"x")
    assert code(e) == "NoSuchUpload"
    s3.abort_multipart_upload(Bucket="shared", Key="admins", UploadId=uid)


def test_keys_that_are_not_paths_are_refused(server, s3, bucket):
    for bad in ["a//b", "../../etc/passwd", "a/./b", ".__locus_put_x"]:
        with pytest.raises(botocore.exceptions.ClientError) as e:
            s3.put_object(Bucket=bucket, Key=bad, Body=b"x")
        assert code(e) == "InvalidArgument", bad
    assert list((server["root"] / bucket).iterdir()) == []


def test_directory_keys(server, s3, bucket):
    s3.put_object(Bucket=bucket, Key="empty/", Body=b"")
    assert (server["root"] / bucket / "empty").is_dir()
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["empty/"]
    assert s3.head_object(Bucket=bucket, Key="empty/")["ContentLength"] == 0
    s3.delete_object(Bucket=bucket, Key="empty/")
    assert not (server["root"] / bucket / "empty").exists()
    # A file's name cannot also be a directory key; deleting it as one is no error.
    s3.put_object(Bucket=bucket, Key="plain", Body=b"x")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket=bucket, Key="plain/", Body=b"")
    assert code(e) == "InvalidRequest"
    s3.delete_object(Bucket=bucket, Key="plain/")
    assert (server["root"] / bucket / "plain").read_bytes() == b"x"


def test_active_file_through_s3(server, s3):
    """A GET of a missing key whose name invokes a registered handler runs it at the
    server and streams its output; a failing one answers an error, not bytes."""
    s3.put_object(Bucket="shared", Key="act/trips.csv", Body=b"a,b\n1,2\n3,4\n")
    got = s3.get_object(Bucket="shared", Key="act/wc@-l,trips.csv")
    assert got["Body"].read() == b"3 trips.csv\n"
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket="shared", Key="act/wc@-l,%2Fetc%2Fpasswd")
    assert status(e) in (400, 404)
    # Not a handler: an ordinary missing key.
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.get_object(Bucket="shared", Key="act/nohandler@trips.csv")
    assert code(e) == "NoSuchKey"


def test_refused_before_parsing(server, s3, bucket):
    """Signature Version 2, browser form uploads and week-plus presigned URLs."""
    import hmac, email.utils
    key, secret = server["admin"]
    date = email.utils.formatdate(usegmt=True)
    sig = base64.b64encode(hmac.new(secret.encode(), f"GET\n\n\n{date}\n/shared/hello.txt".encode(),
                                    "sha1").digest()).decode()
    req = urllib.request.Request(server["endpoint"] + "/shared/hello.txt",
                                 headers={"Date": date, "Authorization": f"AWS {key}:{sig}"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403 and b"Version 2" in e.value.read()
    form = urllib.request.Request(server["endpoint"] + f"/{bucket}", method="POST", data=b"x" * 1000,
                                  headers={"Content-Type": "multipart/form-data; boundary=zz"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(form)
    assert e.value.code == 403
    long = s3.generate_presigned_url("get_object", Params={"Bucket": "shared", "Key": "hello.txt"},
                                     ExpiresIn=8 * 24 * 3600)
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(long)
    assert e.value.code == 403
    # Signature dates with bytes below '0' where digits go (which the s3s crate's date
    # parser would overflow on), in the header, the credential scope and a presigned URL.
    bad = [{"Authorization": f"AWS4-HMAC-SHA256 Credential={key}/#2026112/us-east-1/s3/aws4_request, "
                              "SignedHeaders=host, Signature=00"},
           {"X-Amz-Date": "2026112 T000000Z", "Authorization": "AWS4-HMAC-SHA256 Credential=x"}]
    for headers in bad:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(urllib.request.Request(server["endpoint"] + "/shared/hello.txt", headers=headers))
        assert e.value.code == 400 and b"AuthorizationHeaderMalformed" in e.value.read()
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server["endpoint"] + "/shared/hello.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256"
                               f"&X-Amz-Credential={key}%2F2026%23112%2Fus-east-1%2Fs3%2Faws4_request"
                               "&X-Amz-Date=20261129T000000Z&X-Amz-Expires=60&X-Amz-SignedHeaders=host"
                               "&X-Amz-Signature=00")
    assert e.value.code == 400 and b"AuthorizationHeaderMalformed" in e.value.read()


def test_a_subject_with_rights_on_one_bucket_only(server, s3):
    """alice holds rwld on `shared` and nothing at the root: she still uploads in parts,
    heads her bucket and lists it; buckets she cannot see are not listed."""
    alice = client(server, "alice")
    alice.head_bucket(Bucket="shared")
    assert alice.list_buckets()["Buckets"] == []
    from boto3.s3.transfer import TransferConfig
    src = server["work"] / "alice-upload.bin"
    src.write_bytes(os.urandom(11 << 20))
    alice.upload_file(str(src), "shared", "alice/deep/big.bin",
                      Config=TransferConfig(multipart_threshold=5 << 20, multipart_chunksize=5 << 20))
    assert (server["root"] / "shared/alice/deep/big.bin").read_bytes() == src.read_bytes()
    with pytest.raises(botocore.exceptions.ClientError) as e:
        alice.head_bucket(Bucket="private")
    assert status(e) == 403


def test_deletes_keep_directories_with_their_own_acl(server, s3):
    import subprocess
    s3.put_object(Bucket="shared", Key="locked/f", Body=b"x")
    subprocess.run([server["exe"], "acl", "set", server["native"] + "/shared/locked", "alice", "-"], check=True,
                   env=dict(server["env"], LOCUS_TOKEN=server["admin_token"]))
    s3.delete_object(Bucket="shared", Key="locked/f")
    assert (server["root"] / "shared/locked").is_dir()
    s3.put_object(Bucket="shared", Key="locked/secret", Body=b"admin only")
    with pytest.raises(botocore.exceptions.ClientError) as e:
        client(server, "alice").get_object(Bucket="shared", Key="locked/secret")
    assert code(e) == "AccessDenied"
    # alice's listing of the bucket goes on past the directory she may not list.
    keys = [o["Key"] for o in client(server, "alice").list_objects_v2(Bucket="shared")["Contents"]]
    assert "hello.txt" in keys and "locked/secret" not in keys


def test_a_rewrite_in_place_is_not_taken_for_the_object_written(server, s3, bucket):
    etag = s3.put_object(Bucket=bucket, Key="k", Body=b"AAAA")["ETag"]
    path = server["root"] / bucket / "k"
    st = path.stat()
    with open(path, "r+b") as f:
        f.write(b"BBBB")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    got = s3.get_object(Bucket=bucket, Key="k")
    assert got["Body"].read() == b"BBBB" and got["ETag"] != etag


def test_put_into_a_missing_bucket(s3):
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.put_object(Bucket="no-such-bucket", Key="x", Body=b"1")
    assert code(e) == "NoSuchBucket"
