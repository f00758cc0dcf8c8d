//! `locus._locus`, the native module of the `locus` Python package: Locus' Rust client
//! behind Python calls. The Python side (`python/locus`) adds the fsspec filesystem.
//!
//! Every call releases the GIL while it waits for the server, so threads (dask, a thread
//! pool) overlap their requests on one connection, which pipelines them. Errors are
//! `OSError(errno, message)`, which Python turns into `FileNotFoundError`,
//! `PermissionError` and the other subclasses by errno. `writers` holds the classes that
//! write a file as it is made (`Upload`, streamed on a connection of its own, and
//! `Appender`).

use bytes::{Bytes, BytesMut};
use locus_client::types::{open_flags, Attr, Value};
use locus_client::{blocking, ClientError, LocusUrl, StoreletUpdate};
use pyo3::exceptions::{PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};
use std::sync::{Arc, Mutex};

mod writers;

/// The exception for a failed call: an `OSError` subclass chosen by its errno.
fn os_error(e: ClientError) -> PyErr {
    PyOSError::new_err((e.errno(), e.to_string()))
}

/// A file's attributes as the dict the Python API documents.
fn attr_dict<'py>(py: Python<'py>, a: &Attr) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let kind = match a {
        a if a.is_dir() => "directory",
        a if a.is_symlink() => "link",
        a if a.is_file() => "file",
        _ => "other",
    };
    d.set_item("type", kind)?;
    d.set_item("size", a.size)?;
    d.set_item("mode", a.mode)?;
    d.set_item("nlink", a.nlink)?;
    d.set_item("uid", a.uid)?;
    d.set_item("gid", a.gid)?;
    d.set_item("ino", a.ino)?;
    let t = |t: locus_client::types::Time| t.sec as f64 + t.nsec as f64 / 1e9;
    d.set_item("atime", t(a.atime))?;
    d.set_item("mtime", t(a.mtime))?;
    d.set_item("ctime", t(a.ctime))?;
    Ok(d)
}

/// A Python value as a script argument.
fn to_value(v: &Bound<'_, PyAny>) -> PyResult<Value> {
    if v.is_none() {
        return Ok(Value::Nil);
    }
    if let Ok(b) = v.extract::<bool>() {
        if v.is_instance_of::<pyo3::types::PyBool>() {
            return Ok(Value::Bool(b));
        }
    }
    if let Ok(i) = v.extract::<i64>() {
        return Ok(Value::Int(i));
    }
    if let Ok(f) = v.extract::<f64>() {
        return Ok(Value::Num(f));
    }
    if let Ok(s) = v.extract::<String>() {
        return Ok(Value::Str(s));
    }
    if let Ok(b) = v.cast::<PyBytes>() {
        return Ok(Value::Bytes(b.as_bytes().to_vec()));
    }
    if let Ok(d) = v.cast::<PyDict>() {
        let mut map = Vec::new();
        for (k, v) in d.iter() {
            map.push((k.extract::<String>()?, to_value(&v)?));
        }
        return Ok(Value::Map(map));
    }
    if let Ok(l) = v.cast::<PyList>() {
        return l.iter().map(|x| to_value(&x)).collect::<PyResult<_>>().map(Value::List);
    }
    Err(PyTypeError::new_err(format!("a script argument cannot be a {}", v.get_type().name()?)))
}

/// A script's result as a Python value.
fn from_value(py: Python<'_>, v: Value) -> PyResult<Py<PyAny>> {
    Ok(match v {
        Value::Nil => py.None(),
        Value::Bool(b) => b.into_pyobject(py)?.to_owned().into_any().unbind(),
        Value::Int(i) => i.into_pyobject(py)?.into_any().unbind(),
        Value::Num(f) => f.into_pyobject(py)?.into_any().unbind(),
        Value::Str(s) => s.into_pyobject(py)?.into_any().unbind(),
        Value::Bytes(b) => PyBytes::new(py, &b).into_any().unbind(),
        Value::List(l) => {
            let items = l.into_iter().map(|x| from_value(py, x)).collect::<PyResult<Vec<_>>>()?;
            PyList::new(py, items)?.into_any().unbind()
        }
        Value::Map(m) => {
            let d = PyDict::new(py);
            for (k, v) in m {
                d.set_item(k, from_value(py, v)?)?;
            }
            d.into_any().unbind()
        }
    })
}

/// A connection to a Locus server, authenticated with the credentials the `locus`
/// command would use (`LOCUS_TOKEN`, or `~/.locus/credentials`).
#[pyclass(module = "locus._locus")]
struct Client {
    inner: Arc<blocking::Client>,
    url: String,
}

/// Bytes one `pread` asks for: the server's largest reply.
const READ_STEP: u64 = 4 << 20;

/// Reads of one `read` call in flight at once (64 MiB): enough to keep the link busy,
/// few enough that a large read does not queue the whole file in memory twice.
const READS_IN_FLIGHT: usize = 16;

/// A `put`'s mode: the permissions of `mode`, and `PUT_NEW` for a create-only write.
fn put_mode(mode: u32, create_only: bool) -> u32 {
    (mode & 0o7777) | if create_only { locus_proto::ops::PUT_NEW } else { 0 }
}

#[pymethods]
impl Client {
    /// Connects to `url` (`locus://HOST:PORT/`, or `locus+tls://...`).
    #[new]
    fn new(py: Python<'_>, url: &str) -> PyResult<Client> {
        let parsed = LocusUrl::parse(url).map_err(|e| PyValueError::new_err(format!("{url}: {e}")))?;
        let inner = py.detach(|| blocking::Client::connect_url(&parsed)).map_err(os_error)?;
        Ok(Client { inner: Arc::new(inner), url: url.to_string() })
    }

    fn __repr__(&self) -> String {
        format!("locus.Client({:?})", self.url)
    }

    /// The subject the server knows this connection as.
    fn whoami(&self, py: Python<'_>) -> PyResult<String> {
        py.detach(|| self.inner.run(|c| c.whoami())).map_err(os_error)
    }

    /// Attributes of `path` (symlinks followed).
    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let a = py.detach(|| self.inner.run(|c| c.stat(path))).map_err(os_error)?;
        attr_dict(py, &a)
    }

    /// The entries of a directory, each a `stat` dict with its `name`.
    fn listdir<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let entries = py.detach(|| self.inner.run(|c| c.readdir(path))).map_err(os_error)?;
        entries
            .iter()
            .map(|e| {
                let d = attr_dict(py, &e.attr)?;
                d.set_item("name", &e.name)?;
                Ok(d)
            })
            .collect()
    }

    /// `length` bytes of `path` from `offset` (to the end when `length` is None); fewer
    /// at the end of the file. The reads are sent at once (the client pipelines them)
    /// and land straight in the returned `bytes`, with the GIL released.
    #[pyo3(signature = (path, offset = 0, length = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let client = &self.inner;
        let opened = py.detach(|| client.run(|c| c.open(path, open_flags::READ, 0))).map_err(os_error)?;
        let end = length.map_or(opened.attr.size, |n| offset.saturating_add(n).min(opened.attr.size));
        let len = end.saturating_sub(offset) as usize;
        let mut got = 0;
        let filled = PyBytes::new_with(py, len, |buf| {
            py.detach(|| client.run(|c| fill(c, opened.handle, offset, buf, &mut got))).map_err(os_error)
        });
        let closed = py.detach(|| client.run(|c| c.close(opened.handle)));
        let bytes = filled?;
        closed.map_err(os_error)?;
        // The file shrank under the read: what came is what there is.
        Ok(if got < len { PyBytes::new(py, &bytes.as_bytes()[..got]) } else { bytes })
    }

    /// [`Client::read`] returning a read-only [`Buffer`] instead of `bytes`: the replies
    /// are received straight into it, so the bytes are not copied again on the client.
    #[pyo3(signature = (path, offset = 0, length = None))]
    fn read_buffer(&self, py: Python<'_>, path: &str, offset: u64, length: Option<u64>) -> PyResult<Buffer> {
        let client = &self.inner;
        py.detach(|| {
            client.run(|c| async move {
                let opened = c.open(path, open_flags::READ, 0).await?;
                let end = length.map_or(opened.attr.size, |n| offset.saturating_add(n).min(opened.attr.size));
                let filled = fill_in_place(c, opened.handle, offset, end.saturating_sub(offset) as usize).await;
                let closed = c.close(opened.handle).await;
                let filled = filled?;
                closed.map(|()| filled)
            })
        })
        .map_err(os_error)
    }

    /// Replaces `path` with `data`, atomically (readers see the old or the new file)
    /// and durably; with `create_only`, makes it only if nothing has the name when the
    /// bytes are stored (else `FileExistsError`, nothing changed).
    #[pyo3(signature = (path, data, mode = 0o644, create_only = false))]
    fn write(&self, py: Python<'_>, path: &str, data: &[u8], mode: u32, create_only: bool) -> PyResult<()> {
        let mode = put_mode(mode, create_only);
        py.detach(|| self.inner.run(|c| c.write_file(path, mode, data))).map(drop).map_err(os_error)
    }

    /// Copies the file `src` to `dst` at the server (its bytes do not come here),
    /// replacing `dst` atomically as `write` does; answers the copy's `stat` dict.
    fn copy<'py>(&self, py: Python<'py>, src: &str, dst: &str) -> PyResult<Bound<'py, PyDict>> {
        let a = py.detach(|| self.inner.run(|c| c.copy(src, dst))).map_err(os_error)?;
        attr_dict(py, &a)
    }

    /// Starts storing `path` from bytes given as they are made ([`writers::Upload`]), on
    /// a connection of its own; nothing shows until its `commit` (which, with
    /// `create_only`, fails with `FileExistsError` if the name is taken by then).
    #[pyo3(signature = (path, mode = 0o644, create_only = false))]
    fn upload(&self, py: Python<'_>, path: &str, mode: u32, create_only: bool) -> PyResult<writers::Upload> {
        let mode = put_mode(mode, create_only);
        let url = LocusUrl::parse(&self.url).map_err(|e| PyValueError::new_err(format!("{}: {e}", self.url)))?;
        py.detach(|| writers::Upload::start(&url, path, mode)).map_err(os_error)
    }

    /// Opens `path` (created if missing) for appending at its end ([`writers::Appender`]).
    #[pyo3(signature = (path, mode = 0o644))]
    fn open_append(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<writers::Appender> {
        let client = self.inner.clone();
        py.detach(|| writers::Appender::open(client, path, mode)).map_err(os_error)
    }

    #[pyo3(signature = (path, mode = 0o755))]
    fn mkdir(&self, py: Python<'_>, path: &str, mode: u32) -> PyResult<()> {
        py.detach(|| self.inner.run(|c| c.mkdir(path, mode))).map_err(os_error)
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.inner.run(|c| c.rmdir(path))).map_err(os_error)
    }

    fn unlink(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        py.detach(|| self.inner.run(|c| c.unlink(path))).map_err(os_error)
    }

    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        py.detach(|| self.inner.run(|c| c.rename(src, dst))).map_err(os_error)
    }

    /// Runs the Lua `source` at the server with `args` (registered on first use, then
    /// called by hash); returns its results as a list.
    #[pyo3(signature = (source, args = Vec::new(), input = Vec::new()))]
    fn script_call(
        &self,
        py: Python<'_>,
        source: &str,
        args: Vec<Bound<'_, PyAny>>,
        input: Vec<u8>,
    ) -> PyResult<Vec<Py<PyAny>>> {
        let args = args.iter().map(to_value).collect::<PyResult<Vec<_>>>()?;
        let (values, _) = py.detach(|| self.inner.run(|c| c.script_call(source, args, &input))).map_err(os_error)?;
        values.into_iter().map(|v| from_value(py, v)).collect()
    }

    /// Starts the WebAssembly `module` at the server with `dir` as its `/`; returns an
    /// iterator over its standard output as it arrives.
    #[pyo3(signature = (module, args = Vec::new(), dir = "/", write = false))]
    fn storelet_run(
        &self,
        py: Python<'_>,
        module: Vec<u8>,
        args: Vec<String>,
        dir: &str,
        write: bool,
    ) -> PyResult<Run> {
        let run = py.detach(|| self.inner.run(|c| c.storelet_start(&module, dir, args, write))).map_err(os_error)?;
        Ok(Run {
            client: self.inner.clone(),
            run: Mutex::new(Some(run)),
            id: Mutex::new(None),
            stderr: Mutex::new(Vec::new()),
            result: Mutex::new(None),
        })
    }
}

/// Reads `buf.len()` bytes of the open file `handle` from `offset` into `buf`, keeping
/// [`READS_IN_FLIGHT`] requests in flight (the client pipelines them); `got` ends as the
/// count of bytes that came, short only at the end of the file.
async fn fill(
    c: &locus_client::Client,
    handle: u64,
    offset: u64,
    buf: &mut [u8],
    got: &mut usize,
) -> Result<(), ClientError> {
    let (total, step) = (buf.len(), READ_STEP as usize);
    let mut pending = std::collections::VecDeque::new();
    let mut sent = 0;
    // Requests go out step by step, as the buffer is cut: reply i fills chunk i.
    for dest in buf.chunks_mut(step) {
        while sent < total && pending.len() < READS_IN_FLIGHT {
            let n = (total - sent).min(step);
            pending.push_back(c.pread_ahead(handle, offset + sent as u64, n as u32).await?);
            sent += n;
        }
        let p = pending.pop_front().expect("a read is in flight for every chunk");
        let ((), data) = p.wait_with_data().await?;
        let n = data.len().min(dest.len());
        dest[..n].copy_from_slice(&data[..n]);
        *got += n;
        if n < dest.len() {
            break;
        }
    }
    Ok(())
}

/// Reads `len` bytes of the open file `handle` from `offset` (fewer at the end of the
/// file) as [`fill`] does, but into one allocation cut into a destination per request,
/// which the client receives each reply into.
async fn fill_in_place(c: &locus_client::Client, handle: u64, offset: u64, len: usize) -> Result<Buffer, ClientError> {
    let step = READ_STEP as usize;
    let mut room = BytesMut::with_capacity(len);
    let base = room.as_ptr() as usize;
    let mut pending = std::collections::VecDeque::new();
    let mut parts = Vec::new();
    let (mut sent, mut got, mut in_place) = (0, 0, true);
    while sent < len || !pending.is_empty() {
        while sent < len && pending.len() < READS_IN_FLIGHT {
            let n = (len - sent).min(step);
            // The first `n` bytes of room are this reply's, empty with room for `n` bytes.
            let rest = room.split_off(n);
            let dest = std::mem::replace(&mut room, rest);
            pending.push_back((n, c.pread_into(handle, offset + sent as u64, n as u32, dest).await?));
            sent += n;
        }
        let (asked, p) = pending.pop_front().expect("a read is in flight");
        let ((), data) = p.wait_with_data().await?;
        in_place &= data.as_ptr() as usize == base + got;
        got += data.len();
        let short = data.len() < asked;
        parts.push(data);
        if short {
            break; // the end of the file: what came is what there is
        }
    }
    Ok(Buffer::new(parts, in_place))
}

/// The bytes of a read, exposed through Python's buffer protocol without a copy (wrap it
/// in `memoryview` or pass it to anything that takes bytes-like objects).
#[pyclass(module = "locus._locus", frozen)]
struct Buffer {
    /// Owners of the memory: one allocation, or pieces that lie end to end in it.
    parts: Vec<Bytes>,
    /// Address of the first byte (the first part's), as an integer so the class is `Send`.
    start: usize,
}

impl Buffer {
    /// `parts` as one buffer; `in_place` says they lie end to end in one allocation, in
    /// order (else they are copied into one).
    fn new(parts: Vec<Bytes>, in_place: bool) -> Buffer {
        let parts = if in_place || parts.len() < 2 { parts } else { vec![Bytes::from(parts.concat())] };
        // An empty buffer still lends a non-null (never read) address.
        let start =
            parts.first().map_or(std::ptr::NonNull::<u8>::dangling().as_ptr() as *const u8, |p| p.as_ptr()) as usize;
        Buffer { parts, start }
    }

    /// Bytes held, from `start`.
    fn len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }
}

#[pymethods]
impl Buffer {
    fn __len__(&self) -> usize {
        self.len()
    }

    /// Lends the bytes read-only; the view holds a reference to this object, and so to
    /// the memory, until it is released.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: std::os::raw::c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        // SAFETY: `view` is the caller's to fill; the memory from `start` holds `len`
        // initialised bytes owned by `parts`, kept alive by the reference the view takes
        // on `slf`; it is lent read-only (a writable request fails).
        let r = unsafe {
            pyo3::ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                this.start as *mut std::ffi::c_void,
                this.len() as isize,
                1,
                flags,
            )
        };
        if r == -1 {
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }
}

/// A storelet run: iterate for its standard output; afterwards `exit_code`, `stderr`
/// and `account` tell how it ended.
#[pyclass(module = "locus._locus")]
struct Run {
    client: Arc<blocking::Client>,
    run: Mutex<Option<locus_client::StoreletRun>>,
    /// The server's name for the run, once it has left the queue.
    id: Mutex<Option<u64>>,
    stderr: Mutex<Vec<u8>>,
    result: Mutex<Option<locus_client::types::StoreletResult>>,
}

#[pymethods]
impl Run {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let mut guard = self.run.lock().expect("not poisoned");
        let Some(run) = guard.as_mut() else { return Ok(None) };
        loop {
            let update = py.detach(|| self.client.run(|_| run.next())).map_err(os_error)?;
            match update {
                Some(StoreletUpdate::Stdout(b)) => return Ok(Some(PyBytes::new(py, &b))),
                Some(StoreletUpdate::Stderr(b)) => self.stderr.lock().expect("not poisoned").extend_from_slice(&b),
                Some(StoreletUpdate::Started { run, .. }) => *self.id.lock().expect("not poisoned") = Some(run),
                Some(StoreletUpdate::Finished(result)) => {
                    *self.result.lock().expect("not poisoned") = Some(result);
                }
                None => {
                    *guard = None;
                    return Ok(None);
                }
            }
        }
    }

    /// The program's exit code, once the run has ended (None before).
    #[getter]
    fn exit_code(&self) -> Option<i32> {
        self.result.lock().expect("not poisoned").as_ref().map(|r| r.exit_code)
    }

    /// What the program wrote to its standard error so far.
    #[getter]
    fn stderr<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.stderr.lock().expect("not poisoned"))
    }

    /// The run's account (fuel, CPU, memory, bytes), once it has ended.
    #[getter]
    fn account<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let result = self.result.lock().expect("not poisoned");
        let Some(r) = result.as_ref() else { return Ok(None) };
        let d = PyDict::new(py);
        d.set_item("exit_code", r.exit_code)?;
        d.set_item("fuel", r.fuel)?;
        d.set_item("cpu_us", r.cpu_us)?;
        d.set_item("peak_memory", r.peak_memory)?;
        d.set_item("wall_us", r.wall_us)?;
        d.set_item("read_bytes", r.read_bytes)?;
        d.set_item("write_bytes", r.write_bytes)?;
        Ok(Some(d))
    }

    /// Cancels the run at the server. A run still queued has no name yet: nothing happens
    /// until its first output has been read.
    fn cancel(&self, py: Python<'_>) -> PyResult<()> {
        let Some(id) = *self.id.lock().expect("not poisoned") else { return Ok(()) };
        py.detach(|| self.client.run(|c| c.storelet_cancel(id))).map_err(os_error)
    }
}

/// The module: `Client`, `Run`, `Buffer`, `Upload` and `Appender`.
#[pymodule]
fn _locus(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Run>()?;
    m.add_class::<Buffer>()?;
    m.add_class::<writers::Upload>()?;
    m.add_class::<writers::Appender>()?;
    Ok(())
}
