"""pandas and pyarrow reading and writing Locus through fsspec's locus:// URLs."""

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq


def frame(n=50_000):
    return pd.DataFrame({"id": range(n), "name": [f"n{i % 97}" for i in range(n)], "x": [i * 0.5 for i in range(n)]})


def test_pandas_csv_round_trip(server):
    url = server["url"] + "tables/data.csv"
    fs, _ = fsspec.core.url_to_fs(url)
    fs.makedirs("/tables", exist_ok=True)
    df = frame()
    df.to_csv(url, index=False)
    assert (server["root"] / "tables" / "data.csv").stat().st_size > 500_000
    back = pd.read_csv(url)
    pd.testing.assert_frame_equal(back, df)


def test_parquet_with_pandas_and_pyarrow(server):
    fs, path = fsspec.core.url_to_fs(server["url"] + "pq/t.parquet")
    assert path == "/pq/t.parquet"
    fs.makedirs("/pq", exist_ok=True)
    df = frame()
    df.to_parquet(server["url"] + "pq/t.parquet", row_group_size=10_000)
    pd.testing.assert_frame_equal(pd.read_parquet(server["url"] + "pq/t.parquet"), df)
    # pyarrow on the fsspec filesystem: a column projection reads ranges, not the file.
    table = pq.read_table("/pq/t.parquet", filesystem=fs, columns=["x"])
    assert table.num_rows == len(df) and table.column_names == ["x"]
    pq.write_table(pa.table({"a": [1, 2, 3]}), "/pq/small.parquet", filesystem=fs)
    assert pq.read_table("/pq/small.parquet", filesystem=fs).column("a").to_pylist() == [1, 2, 3]


def test_pyarrow_dataset_over_a_directory(server):
    fs, _ = fsspec.core.url_to_fs(server["url"])
    fs.makedirs("/ds", exist_ok=True)
    for i in range(3):
        pq.write_table(pa.table({"part": [i] * 100, "v": list(range(100))}), f"/ds/p{i}.parquet", filesystem=fs)
    dataset = ds.dataset("/ds", filesystem=fs, format="parquet")
    assert dataset.to_table().num_rows == 300
    assert sorted(fs.ls("/ds", detail=False)) == ["/ds/p0.parquet", "/ds/p1.parquet", "/ds/p2.parquet"]
    assert fs.info("/ds/p0.parquet")["type"] == "file"
    assert fs.modified("/ds/p0.parquet").year >= 2024
    assert fs.find("/ds") == ["/ds/p0.parquet", "/ds/p1.parquet", "/ds/p2.parquet"]
    fs.rm("/ds", recursive=True)
    assert not fs.exists("/ds")


def test_large_reads_in_order_and_out_of_order_return_exact_bytes(server):
    # Large reads go straight to the server, small ones through one block of read-ahead:
    # both, in order and not, and a read past the end, give exactly the file's bytes.
    import random

    data = random.Random(5).randbytes(9 << 20)
    fs, _ = fsspec.core.url_to_fs(server["url"])
    fs.pipe_file("/ahead.bin", data)
    with fs.open("/ahead.bin", "rb") as f:
        offset = 0
        for size in [1 << 20, 1 << 20, 1536 << 10, 1 << 20, 3 << 20]:
            f.seek(offset)
            assert f.read(size) == data[offset : offset + size]
            offset += size
        rng = random.Random(9)
        for _ in range(40):
            start = rng.randrange(0, len(data))
            size = rng.choice([100, 4096, 1 << 20, (1 << 20) + 17, 2 << 20])
            f.seek(start)
            assert f.read(size) == data[start : start + size], (start, size)
        f.seek(len(data) - (1 << 20))
        assert f.read(4 << 20) == data[-(1 << 20) :]
        # pyarrow's wrapper calls read_buffer: large reads lend the received bytes.
        for start, size in [(0, 5 << 20), (123, 100), (7 << 20, 4 << 20), (len(data), 10)]:
            f.seek(start)
            got = f.read_buffer(size)
            assert bytes(got) == data[start : start + size] and f.tell() == min(start + size, len(data))
