"""An fsspec filesystem for ``locus://HOST:PORT/path`` (and ``locus+tls://``) URLs.

Reads are ranged: a file opened for reading fetches the blocks it is asked for with
pipelined reads at offsets, so pyarrow reading a Parquet footer and a few columns moves
only those bytes. A file opened for writing is stored with one atomic ``put`` (readers
see the old file or the new one, never a part): a small one in one request at close, a
larger one streamed to the server block by block as it is written (on a connection of
its own), so its size does not bound the memory a writer needs. ``ab`` appends at the
file's end at the server, without reading the file. Copies (``cp_file``) are made at the
server. Writes make the directories above the file when they are missing, as object
stores' filesystems do.
"""

from __future__ import annotations

import errno
import posixpath
from typing import Any, Optional

from fsspec.caching import ReadAheadCache
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem
from fsspec.utils import infer_storage_options

from ._locus import Client

DEFAULT_PORT = 9610
DEFAULT_BLOCK = 1 << 20


def _datetime(seconds: float):
    import datetime

    return datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)


def _info(path: str, st: dict) -> dict:
    kind = {"file": "file", "directory": "directory"}.get(st["type"], "other")
    return {
        "name": path,
        "size": st["size"] if kind == "file" else 0,
        "type": kind,
        "mode": st["mode"],
        "mtime": st["mtime"],
        "created": st["ctime"],
        "ino": st["ino"],
        "nlink": st["nlink"],
    }


class LocusFileSystem(AbstractFileSystem):
    """Files of one Locus server. ``fsspec.filesystem("locus", host=..., port=...)``,
    or any ``locus://HOST:PORT/path`` URL handed to pandas, pyarrow or dask."""

    protocol = ("locus", "locus+tls")
    root_marker = "/"

    def __init__(self, host: str = "127.0.0.1", port: int = DEFAULT_PORT, tls: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        scheme = "locus+tls" if tls else "locus"
        self.url = f"{scheme}://{host}:{port}/"
        self.client = Client(self.url)

    @classmethod
    def _strip_protocol(cls, path: str) -> str:
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        for proto in ("locus+tls://", "locus://"):
            if path.startswith(proto):
                rest = path[len(proto) :]
                path = rest[rest.find("/") :] if "/" in rest else "/"
                break
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path: str) -> dict:
        opts = infer_storage_options(path)
        out: dict = {}
        if opts.get("host"):
            out["host"] = opts["host"]
        if opts.get("port"):
            out["port"] = int(opts["port"])
        if path.startswith("locus+tls://"):
            out["tls"] = True
        return out

    def ls(self, path: str, detail: bool = True, **kwargs: Any):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if st["type"] != "directory":
            entries = [_info(path, st)]
        else:
            entries = [_info(posixpath.join(path, e["name"]), e) for e in self.client.listdir(path)]
            entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def info(self, path: str, **kwargs: Any) -> dict:
        path = self._strip_protocol(path)
        return _info(path, self.client.stat(path))

    def cat_file(self, path: str, start: Optional[int] = None, end: Optional[int] = None, **kwargs: Any) -> bytes:
        path = self._strip_protocol(path)
        if start is None and end is None:
            return self.client.read(path)
        size = None
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.info(path)["size"]
        start = 0 if start is None else (start + size if start < 0 else start)
        if end is None:
            return self.client.read(path, start)
        end = end + size if end < 0 else end
        return self.client.read(path, start, max(0, end - start))

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if mode == "create":
            # Refused at once if the file exists; else made only if the name is still free
            # when the bytes are stored (the server checks that atomically): of two racing
            # creators, one gets FileExistsError.
            if self.exists(path):
                raise FileExistsError(errno.EEXIST, "file exists", path)
            self._with_parents(path, lambda: self.client.write(path, bytes(value), create_only=True))
            return
        self._with_parents(path, self.client.write, path, bytes(value))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Copies at the server: the bytes do not come to this process."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        try:
            self._with_parents(path2, self.client.copy, path1, path2, source=path1)
        except IsADirectoryError:
            # fsspec's recursive copy hands directories here too, before their contents.
            if not self.isdir(path1):
                raise
            self.makedirs(path2, exist_ok=True)

    def _with_parents(self, path: str, call, *args: Any, source: Optional[str] = None):
        """``call(*args)``, which makes ``path``; if that fails for a missing directory
        above ``path`` (and not for a missing ``source``), the directories are made and
        it is called again."""
        try:
            return call(*args)
        except FileNotFoundError:
            parent = posixpath.dirname(path)
            if parent in ("", "/") or self.exists(parent) or (source is not None and not self.exists(source)):
                raise
            self.makedirs(parent, exist_ok=True)
            return call(*args)

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        path = self._strip_protocol(path)
        if create_parents:
            self.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        path = self._strip_protocol(path)
        parts = [p for p in path.split("/") if p]
        for i in range(1, len(parts) + 1):
            sub = "/" + "/".join(parts[:i])
            try:
                self.client.mkdir(sub)
            except FileExistsError:
                if i == len(parts) and not exist_ok:
                    raise
            except PermissionError:
                # A directory may refuse new names and still hold this one.
                if (i == len(parts) and not exist_ok) or not self.isdir(sub):
                    raise

    def rmdir(self, path: str) -> None:
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path: str) -> None:
        # fsspec's recursive rm hands directories here too, after their contents.
        path = self._strip_protocol(path)
        try:
            self.client.unlink(path)
        except IsADirectoryError:
            self.client.rmdir(path)

    def mv(self, path1: str, path2: str, recursive: bool = False, maxdepth: Optional[int] = None, **kwargs: Any):
        self.client.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def created(self, path: str):
        return _datetime(self.info(path)["created"])

    def modified(self, path: str):
        return _datetime(self.info(path)["mtime"])

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: Optional[int] = None,
        autocommit: bool = True,
        cache_options: Optional[dict] = None,
        **kwargs: Any,
    ) -> "LocusFile":
        path = self._strip_protocol(path)
        if mode not in ("rb", "wb", "xb", "ab"):
            raise ValueError(f"mode {mode!r}: locus files open as rb, wb, xb or ab")
        if mode == "xb" and self.exists(path):
            # Checked at open, and again when the file is stored: a writer that makes it
            # meanwhile makes this one's close fail with FileExistsError.
            raise FileExistsError(errno.EEXIST, "file exists", path)
        # Reads are read ahead by one block: 1 MiB serves small sequential reads (a CSV
        # parser's) in few round trips and costs large ranged reads (pyarrow's column
        # chunks) little.
        return LocusFile(self, path, mode, block_size or DEFAULT_BLOCK, autocommit, cache_options=cache_options, **kwargs)


class DirectLargeReads(ReadAheadCache):
    """Read-ahead by one block for small reads (a parser's); a read of a block or more
    (pyarrow's column chunks) goes straight to the server: no bytes fetched beyond it and
    none copied through the cache."""

    name = "locus-direct-large"

    def _fetch(self, start: Optional[int], end: Optional[int]) -> bytes:
        start = 0 if start is None else start
        end = self.size if end is None or end > self.size else end
        if end - start >= self.blocksize:
            self.total_requested_bytes += end - start
            return self.fetcher(start, end)
        return super()._fetch(start, end)


class LocusFile(AbstractBufferedFile):
    """A file on Locus: ranged reads (see DirectLargeReads); writes stored with one atomic
    ``put``, streamed once they pass a block; appends (``ab``) written at the file's end.

    With ``autocommit=False`` (an fsspec transaction) a written file is stored at
    ``commit`` and given up at ``discard``; appends go to the file as they are made."""

    def __init__(self, fs: LocusFileSystem, path: str, mode: str, block_size: int, autocommit: bool, **kwargs: Any):
        self._upload = None  # the streamed put, once the file has outgrown one block
        self._whole: Optional[bytes] = None  # a small file's bytes, until commit
        self._appender = None
        if mode == "ab":
            self._appender = fs._with_parents(path, fs.client.open_append, path)
        super().__init__(fs, path, mode=mode, block_size=block_size, autocommit=autocommit, **kwargs)
        if self._appender is not None:
            self.loc = self._appender.size
        if mode == "rb" and "cache_type" not in kwargs:
            self.cache = DirectLargeReads(self.blocksize, self._fetch_range, self.size)

    def read_buffer(self, length: int = -1) -> bytes | memoryview:
        """``read`` for pyarrow (its Python-file wrapper calls this when it exists): a read
        of a block or more comes as a read-only memoryview of the bytes as they were
        received, with no copy into a ``bytes``."""
        if self.mode != "rb" or self.closed:
            return self.read(length)
        left = max(0, self.size - self.loc)
        length = left if length is None or length < 0 else min(length, left)
        if length < self.blocksize:
            return self.read(length)
        buf = memoryview(self.fs.client.read_buffer(self.path, self.loc, length))
        self.loc += len(buf)
        return buf

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.fs.client.read(self.path, start, max(0, end - start))

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        data = self.buffer.getvalue()
        if self._appender is not None:
            if data:
                self._appender.write(data)
            if final:
                self._appender.close()
            return True
        if self._upload is None and final:
            self._whole = data  # the whole file fits in a block: one request stores it
        else:
            if self._upload is None:
                # A refusal of the stream comes only with its reply: a missing directory
                # above the file is made before the first bytes go.
                parent = posixpath.dirname(self.path)
                if parent not in ("", "/") and not self.fs.exists(parent):
                    self.fs.makedirs(parent, exist_ok=True)
                self._upload = self.fs.client.upload(self.path, create_only=self.mode == "xb")
            self._upload.write(data)
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self) -> None:
        """Stores what was written under the file's name (atomically)."""
        upload, whole = self._upload, self._whole
        self._upload = self._whole = None
        if upload is not None:
            upload.commit()
        elif whole is not None:
            create_only = self.mode == "xb"
            self.fs._with_parents(self.path, lambda: self.fs.client.write(self.path, whole, create_only=create_only))

    def discard(self) -> None:
        """Gives up what was written: nothing is stored."""
        if self._upload is not None:
            self._upload.abort()
        self._upload = self._whole = None
