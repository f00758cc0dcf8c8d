//! Files written from Python as they are made: [`Upload`], a `put` streamed to the server
//! on a connection of its own (nothing shows until it is committed; abandoned, it
//! leaves nothing), and [`Appender`], a handle that appends at the file's end without
//! reading the file first.

use crate::{attr_dict, os_error};
use locus_client::types::open_flags;
use locus_client::{blocking, PutStream};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};

/// Bytes one `pwrite` of an append carries at most (the server takes 16 MiB frames).
const APPEND_STEP: usize = 4 << 20;

/// A streamed upload and the connection it goes on (the stream first: it is dropped
/// before the connection's runtime).
struct Streaming {
    stream: PutStream,
    conn: blocking::Client,
}

/// A file being stored with one `put` whose bytes stream to the server as they are
/// written: at most a frame of them (1 MiB) is held here. `commit` makes it the file
/// (atomically: readers see the old file or the new one); `abort`, or dropping it
/// uncommitted, ends its connection, and the server removes what it had received.
#[pyclass(module = "locus._locus")]
pub(crate) struct Upload {
    state: Mutex<Option<Streaming>>,
}

impl Upload {
    /// Starts a `put` of `path` (mode `mode`) on a new connection to `url`.
    pub(crate) fn start(
        url: &locus_client::LocusUrl,
        path: &str,
        mode: u32,
    ) -> Result<Upload, locus_client::ClientError> {
        let conn = blocking::Client::connect_url(url)?;
        let stream = conn.inner().put_stream(path, mode)?;
        Ok(Upload { state: Mutex::new(Some(Streaming { stream, conn })) })
    }
}

#[pymethods]
impl Upload {
    /// Adds `data` to the file; fails at once if the server has refused the upload.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let mut guard = self.state.lock().expect("not poisoned");
        let s = guard.as_mut().ok_or_else(|| PyValueError::new_err("the upload is over"))?;
        let (conn, stream) = (&s.conn, &mut s.stream);
        let written = py.detach(|| conn.run(|_| stream.write(data)));
        if written.is_err() {
            *guard = None; // refused: its connection goes
        }
        written.map_err(os_error)
    }

    /// Stores what was written under the file's name; answers its attributes.
    fn commit<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.state.lock().expect("not poisoned").take();
        let Streaming { stream, conn } = s.ok_or_else(|| PyValueError::new_err("the upload is over"))?;
        let attr = py.detach(|| conn.run(|_| stream.finish())).map_err(os_error)?;
        attr_dict(py, &attr)
    }

    /// Gives the upload up: nothing is stored.
    fn abort(&self) {
        self.state.lock().expect("not poisoned").take();
    }

    /// Bytes written so far.
    fn __len__(&self) -> usize {
        self.state.lock().expect("not poisoned").as_ref().map_or(0, |s| s.stream.len() as usize)
    }
}

/// A file open for appending (created if missing): each `write` goes to the file's end at
/// the server, as POSIX `O_APPEND` writes do, without the file being read.
#[pyclass(module = "locus._locus")]
pub(crate) struct Appender {
    client: Arc<blocking::Client>,
    handle: Mutex<Option<u64>>,
    /// The file's size when it was opened.
    #[pyo3(get)]
    size: u64,
}

impl Appender {
    /// Opens `path` to append on `client`'s connection.
    pub(crate) fn open(
        client: Arc<blocking::Client>,
        path: &str,
        mode: u32,
    ) -> Result<Appender, locus_client::ClientError> {
        let flags = open_flags::WRITE | open_flags::APPEND | open_flags::CREATE;
        let opened = client.run(|c| c.open(path, flags, mode))?;
        Ok(Appender { client, handle: Mutex::new(Some(opened.handle)), size: opened.attr.size })
    }
}

#[pymethods]
impl Appender {
    /// Appends `data` at the file's end.
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let handle = self.handle.lock().expect("not poisoned");
        let handle = handle.ok_or_else(|| PyValueError::new_err("the file is closed"))?;
        py.detach(|| {
            self.client.run(|c| async move {
                for step in data.chunks(APPEND_STEP) {
                    c.pwrite(handle, 0, step).await?;
                }
                Ok(())
            })
        })
        .map_err(os_error)
    }

    /// Closes the handle.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let Some(handle) = self.handle.lock().expect("not poisoned").take() else { return Ok(()) };
        py.detach(|| self.client.run(|c| c.close(handle))).map_err(os_error)
    }
}

impl Drop for Appender {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.get_mut().expect("not poisoned").take() {
            let _ = self.client.run(|c| c.close(handle));
        }
    }
}
