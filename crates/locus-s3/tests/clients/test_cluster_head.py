"""The S3 door of a cluster head: objects whose bytes live on a data node, through the
head's namespace, with the same operations as on one server."""

import hashlib
import os
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from conftest import client, keys


def wait_port(port_file, word, proc, log):
    deadline = time.time() + 30
    while True:
        text = port_file.read_text() if port_file.exists() else ""
        lines = dict(l.split() if " " in l else ("native", l) for l in text.splitlines())
        if word in lines:
            return int(lines[word])
        assert proc.poll() is None, "exited at start: " + log.read_text()
        assert time.time() < deadline, f"no {word} port: " + log.read_text()
        time.sleep(0.05)


def test_s3_on_a_cluster_head_with_a_data_node(tmp_path):
    exe = os.environ["LOCUS_BIN"]
    head_state, node_state = tmp_path / "head-state", tmp_path / "node-state"
    head_state.mkdir()
    admin = keys(exe, head_state, "admin")
    env = dict(os.environ, LOCUS_HOME=str(tmp_path / "home"), LOCUS_LOG="warn")
    procs = []
    try:
        head_log = tmp_path / "head.log"
        head = subprocess.Popen([exe, "serve", "--head", "--listen", "127.0.0.1:0", "--root", str(tmp_path / "head-root"),
                                 "--state", str(head_state), "--port-file", str(tmp_path / "head-ports"),
                                 "--s3-port", "0"], env=env, stdout=open(head_log, "w"), stderr=subprocess.STDOUT)
        procs.append(head)
        native = wait_port(tmp_path / "head-ports", "native", head, head_log)
        s3_port = wait_port(tmp_path / "head-ports", "s3", head, head_log)
        node_token = next(l.split()[1] for l in (head_state / "tokens").read_text().splitlines()
                          if l.startswith("locus-node "))
        node_log = tmp_path / "node.log"
        node = subprocess.Popen([exe, "serve", "--data-node", f"locus://127.0.0.1:{native}/", "--listen", "127.0.0.1:0",
                                 "--root", str(tmp_path / "node-root"), "--state", str(node_state),
                                 "--http-port", "0", "--port-file", str(tmp_path / "node-ports")],
                                env=dict(env, LOCUS_TOKEN=f"locus-node:{node_token}"),
                                stdout=open(node_log, "w"), stderr=subprocess.STDOUT)
        procs.append(node)
        srv = {"endpoint": f"http://127.0.0.1:{s3_port}", "admin": admin}
        s3 = client(srv)
        s3.create_bucket(Bucket="data")
        body = os.urandom(3 << 20)
        deadline = time.time() + 30
        while True:  # until the node has joined and takes the bytes
            try:
                r = s3.put_object(Bucket="data", Key="dir/big.bin", Body=body)
                break
            except Exception:
                assert time.time() < deadline, node_log.read_text()
                time.sleep(0.3)
        assert r["ETag"] == '"%s"' % hashlib.md5(body).hexdigest()
        assert s3.get_object(Bucket="data", Key="dir/big.bin")["Body"].read() == body
        assert s3.get_object(Bucket="data", Key="dir/big.bin", Range="bytes=100-199")["Body"].read() == body[100:200]
        # The bytes are on the data node, not in the head's export.
        stored = [p for p in (tmp_path / "node-root").rglob("*") if p.is_file() and p.stat().st_size == len(body)]
        assert stored, "the object's bytes are not on the data node"
        # A presigned GET is sent to the data node that holds the bytes (third-party
        # transfer); an HTTP client following the redirect gets them from there.
        node_http = wait_port(tmp_path / "node-ports", "http", node, node_log)
        url = s3.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "dir/big.bin"}, ExpiresIn=300)

        class Stay(urllib.request.HTTPRedirectHandler):
            def redirect_request(self, *args, **kwargs):
                return None

        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.build_opener(Stay).open(url)
        assert answer.value.code == 307
        assert answer.value.headers["Location"].startswith(f"http://127.0.0.1:{node_http}/o/")
        assert urllib.request.urlopen(url).read() == body
        # A tampered URL is refused at the head, not redirected.
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.build_opener(Stay).open(url.replace("big.bin", "bog.bin"))
        assert answer.value.code == 403
        # A small file the head streams itself.
        s3.put_object(Bucket="data", Key="small.txt", Body=b"small")
        small = s3.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "small.txt"}, ExpiresIn=300)
        assert urllib.request.urlopen(small).read() == b"small"
        s3.delete_object(Bucket="data", Key="small.txt")
        assert [o["Key"] for o in s3.list_objects_v2(Bucket="data")["Contents"]] == ["dir/big.bin"]
        s3.copy_object(Bucket="data", Key="copy.bin", CopySource={"Bucket": "data", "Key": "dir/big.bin"})
        assert s3.get_object(Bucket="data", Key="copy.bin")["Body"].read() == body
        uid = s3.create_multipart_upload(Bucket="data", Key="mp.bin")["UploadId"]
        parts = [os.urandom(5 << 20), os.urandom(100)]
        tags = [s3.upload_part(Bucket="data", Key="mp.bin", UploadId=uid, PartNumber=n, Body=p)["ETag"]
                for n, p in enumerate(parts, 1)]
        s3.complete_multipart_upload(Bucket="data", Key="mp.bin", UploadId=uid, MultipartUpload={
            "Parts": [{"PartNumber": n, "ETag": t} for n, t in enumerate(tags, 1)]})
        assert s3.get_object(Bucket="data", Key="mp.bin")["Body"].read() == b"".join(parts)
        s3.delete_objects(Bucket="data", Delete={"Objects": [{"Key": k} for k in ["dir/big.bin", "copy.bin", "mp.bin"]]})
        assert s3.list_objects_v2(Bucket="data").get("Contents", []) == []
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
