"""The S3 door's options, each on a server of its own: HTTPS under --tls, an anonymous
subject, virtual-host-style addressing, and the removal of abandoned uploads."""

import http.client
import os
import ssl
import time
import urllib.error
import urllib.request

import botocore
import pytest
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from conftest import client, start


@pytest.fixture
def started(tmp_path):
    procs = []

    def run(*flags):
        facts, proc = start(tmp_path / f"s{len(procs)}", flags)
        procs.append(proc)
        return facts

    yield run
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def test_https_under_tls_with_the_servers_certificate(started):
    srv = started("--tls")
    cert = str(srv["state"] / "cert.pem")
    import boto3
    from botocore.config import Config
    key, secret = srv["admin"]
    s3 = boto3.client("s3", endpoint_url=srv["endpoint"], aws_access_key_id=key, aws_secret_access_key=secret,
                      region_name="us-east-1", verify=cert,
                      config=Config(signature_version="s3v4", s3={"addressing_style": "path"}))
    out = s3.put_object(Bucket="shared", Key="over-tls", Body=b"encrypted on the way",
                        ChecksumAlgorithm="CRC32")
    # Over HTTPS boto3 leaves the payload unsigned and sends its CRC32 in the body's
    # trailer: the door checked it (and says so by giving it back).
    import base64
    import zlib
    assert out["ChecksumCRC32"] == base64.b64encode(zlib.crc32(b"encrypted on the way").to_bytes(4, "big")).decode()
    assert s3.get_object(Bucket="shared", Key="over-tls")["Body"].read() == b"encrypted on the way"
    # Plain HTTP to the TLS port gets nothing.
    with pytest.raises(Exception):
        urllib.request.urlopen(srv["endpoint"].replace("https", "http") + "/shared/over-tls", timeout=5).read()


def test_anonymous_requests_act_as_the_named_subject(started):
    srv = started("--s3-anonymous", "guest")
    url = srv["endpoint"] + "/shared/hello.txt"
    # guest holds nothing yet: refused by the ACL, not by the door.
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    assert e.value.code == 403
    import subprocess
    acl = lambda *a: subprocess.run([srv["exe"], "acl", "set", *a], check=True,
                                    env=dict(srv["env"], LOCUS_TOKEN=srv["admin_token"]))
    # `*` is every subject holding a token: never the anonymous one.
    acl(srv["native"] + "/shared", "*", "rwld")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url)
    assert e.value.code == 403
    acl(srv["native"] + "/shared", "anonymous:guest", "rl")
    assert urllib.request.urlopen(url).read() == b"hello from the export\n"
    req = urllib.request.Request(srv["endpoint"] + "/shared/by-guest", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req)
    assert e.value.code == 403
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(srv["endpoint"] + "/private/")
    assert e.value.code == 403
    # Uploads in parts are a subject's own: unsigned clients, all one subject, get none.
    acl(srv["native"] + "/shared", "anonymous:guest", "rwl")
    start_upload = urllib.request.Request(srv["endpoint"] + "/shared/parts?uploads", data=b"", method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(start_upload)
    assert e.value.code == 403
    # A body cut short (the client closed its side early) is the client's error, and
    # nothing is stored.
    import socket
    with socket.create_connection(("127.0.0.1", srv["port"])) as sock:
        sock.sendall(b"PUT /shared/cut.txt HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly some")
        sock.shutdown(socket.SHUT_WR)
        answer = sock.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400") and b"IncompleteBody" in answer, answer
    assert not (srv["root"] / "shared" / "cut.txt").exists()
    log = (srv["work"] / "serve.log").read_text()
    assert "ERROR" not in log, log


def test_virtual_host_style_addressing(started):
    srv = started("--s3-domain", "s3.locus.test")
    key, secret = srv["admin"]
    host = f"shared.s3.locus.test:{srv['port']}"
    req = AWSRequest(method="GET", url=f"http://{host}/hello.txt", headers={"Host": host, "x-amz-content-sha256": "UNSIGNED-PAYLOAD"})
    SigV4Auth(Credentials(key, secret), "s3", "us-east-1").add_auth(req)
    conn = http.client.HTTPConnection("127.0.0.1", srv["port"], timeout=10)
    conn.request("GET", "/hello.txt", headers=dict(req.headers.items()))
    r = conn.getresponse()
    assert r.status == 200, r.read()
    assert r.read() == b"hello from the export\n"
    # Path style goes on working beside it, by address.
    assert client(srv).get_object(Bucket="shared", Key="hello.txt")["Body"].read() == b"hello from the export\n"


def test_abandoned_uploads_are_removed_after_their_age(started):
    srv = started("--s3-upload-max-age-h", "0.0005")  # 1.8 s
    s3 = client(srv)
    uid = s3.create_multipart_upload(Bucket="shared", Key="abandoned")["UploadId"]
    s3.upload_part(Bucket="shared", Key="abandoned", UploadId=uid, PartNumber=1, Body=os.urandom(1000))
    uploads = srv["state"] / "s3-uploads"
    assert [p.name for p in uploads.iterdir()] == [uid]
    deadline = time.time() + 15
    while list(uploads.iterdir()):
        assert time.time() < deadline, "the abandoned upload was not removed"
        time.sleep(0.2)
    with pytest.raises(botocore.exceptions.ClientError) as e:
        s3.upload_part(Bucket="shared", Key="abandoned", UploadId=uid, PartNumber=2, Body=b"x")
    assert e.value.response["Error"]["Code"] == "NoSuchUpload"
    assert not (srv["root"] / "shared" / "abandoned").exists()
