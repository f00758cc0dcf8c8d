//! A blocking facade over the async client, for synchronous programs (the FUSE mount,
//! the interposition agent, simple tools). Each call runs the async call to completion
//! on a private single-threaded runtime.

use crate::error::Result;
use crate::{ConnectOptions, LocusUrl};
use std::future::Future;

/// A blocking connection to a Locus server.
pub struct Client {
    rt: tokio::runtime::Runtime,
    inner: crate::Client,
}

impl Client {
    /// Connects and authenticates.
    pub fn connect(opts: &ConnectOptions) -> Result<Client> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let inner = rt.block_on(crate::Client::connect(opts))?;
        Ok(Client { rt, inner })
    }

    /// Connects to the server of a URL.
    pub fn connect_url(url: &LocusUrl) -> Result<Client> {
        Client::connect(&ConnectOptions::for_url(url)?)
    }

    /// Runs any async call of the underlying client to completion:
    /// `c.run(|c| c.stat("/x"))`.
    pub fn run<'a, F, T>(&'a self, f: impl FnOnce(&'a crate::Client) -> F) -> T
    where
        F: Future<Output = T> + 'a,
    {
        self.rt.block_on(f(&self.inner))
    }

    /// The async client underneath.
    pub fn inner(&self) -> &crate::Client {
        &self.inner
    }
}
