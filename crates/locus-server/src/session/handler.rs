//! The operation table carried out for one client: [`Handler`] on [`Session`], one method per
//! operation, each checking the caller's rights and answering from the store (or from the
//! script, storelet and active-file hosts, and for a data node its objects).

use super::{growing_attr, listing, store, Session};
use crate::active::{self, Found};
use crate::dispatch::Reply;
use crate::dispatch::{Answer, Handler};
use crate::transport::Body;
use bytes::Bytes;
use locus_proto::auth;
use locus_proto::ops::*;
use locus_proto::types::*;
use locus_proto::{Code, Error as WireError};
use locus_store::StoreError;
use std::sync::Arc;

impl Handler for Session {
    fn hello(&mut self, req: Hello, _: Bytes) -> Reply<Challenge> {
        if req.version < locus_proto::frame::MIN_VERSION {
            return Err(WireError::new(
                Code::PROTO,
                format!(
                    "this server speaks Locus protocol {}; a client of protocol {} must be upgraded",
                    locus_proto::frame::VERSION,
                    req.version
                ),
            ));
        }
        let mut nonce = vec![0u8; auth::NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the OS provides randomness");
        self.server_nonce = Some(nonce.clone());
        Ok(Challenge { version: locus_proto::frame::VERSION, server: self.shared.config.name.clone(), nonce }.into())
    }

    fn auth(&mut self, req: Auth, _: Bytes) -> Reply<Welcome> {
        let denied = || WireError::new(Code::AUTH_FAILED, "authentication failed: unknown subject or wrong token");
        // A nonce is good for one attempt, so a failed guess cannot be retried against it.
        let server_nonce =
            self.server_nonce.take().ok_or_else(|| WireError::new(Code::AUTH_FAILED, "send hello before auth"))?;
        if req.nonce.len() != auth::NONCE_LEN {
            return Err(denied());
        }
        let Some(link) = &self.link else { return Err(denied()) };
        // A proof for an address that is not this server's was made for another server,
        // which passed our challenge on (under TLS the exporter secret stops that).
        if link.exporter.is_empty() && !self.shared.names_this_server(link.local, &req.server) {
            tracing::warn!(subject = %req.subject, server = %req.server, "login for another server's address refused");
            return Err(WireError::new(
                Code::AUTH_FAILED,
                format!(
                    "authentication failed: {} does not name this server (its operator can add the name with \
                     `locus serve --name`)",
                    req.server
                ),
            ));
        }
        let bind = auth::Binding { server: &req.server, tls: &link.exporter };
        // A data node knows its own subjects, and every subject of its cluster by the
        // token the cluster key derives for it.
        let own = self.shared.tokens.get(&req.subject).map(<[u8]>::to_vec);
        let now = locus_proto::capability::now();
        let derived = self.shared.node_key().map_or_else(Vec::new, |keys| keys.node_tokens(&req.subject, now));
        let token = own.into_iter().chain(derived.into_iter().map(String::into_bytes)).find(|t| {
            auth::proofs_equal(&auth::client_proof(t, &server_nonce, &req.nonce, &req.subject, &bind), &req.proof)
        });
        let Some(token) = token else {
            tracing::warn!(subject = %req.subject, "authentication failed");
            return Err(denied());
        };
        let token = &token[..];
        let proof = auth::server_proof(token, &server_nonce, &req.nonce, &req.subject, &bind);
        self.subject = Some(req.subject.clone());
        if self.outbox.is_some() {
            self.shared.registry.authenticated(self.client_id, &req.subject);
        }
        Ok(Welcome { client_id: self.client_id, subject: req.subject, proof, head: false, heads: Vec::new() }.into())
    }

    fn ping(&mut self, _: Ping, _: Bytes) -> Reply<()> {
        self.pinged = true;
        Ok(().into())
    }

    fn whoami(&mut self, _: Whoami, _: Bytes) -> Reply<String> {
        Ok(self.who()?.to_string().into())
    }

    fn stat(&mut self, req: Stat, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::LIST);
        match self.shared.store.stat(self.who()?, &req.path) {
            Ok(attr) => Ok(attr.into()),
            Err(e) => self.active_attr(&req.path, e),
        }
    }

    fn lstat(&mut self, req: Lstat, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::LIST);
        match self.shared.store.lstat(self.who()?, &req.path) {
            Ok(attr) => Ok(attr.into()),
            Err(e) => self.active_attr(&req.path, e),
        }
    }

    fn fstat(&mut self, req: Fstat, _: Bytes) -> Reply<Attr> {
        let file = self.handle(req.handle)?.clone();
        // The handle shows the subject could open it.
        self.promise(&file.rel, false, Rights(0));
        match self.growing.get(&req.handle) {
            Some(run) => Ok(growing_attr(&file, run)?.into()),
            None => Ok(store(file.stat())?.into()),
        }
    }

    fn open(&mut self, req: Open, _: Bytes) -> Reply<Opened> {
        if self.handles.len() >= self.shared.config.max_handles {
            return Err(WireError::new(Code(24), "too many open handles on this connection"));
            // EMFILE
        }
        let mut need = Rights(0);
        if req.flags & open_flags::READ != 0 {
            need = need.union(Rights::READ);
        }
        if req.flags & open_flags::WRITE != 0 {
            need = need.union(Rights::WRITE);
        }
        self.promise(&req.path, false, if need.0 == 0 { Rights::LIST } else { need });
        let (file, attr, run) = match self.shared.store.open(self.who()?, &req.path, req.flags, req.mode) {
            Ok(file) => {
                if req.flags & (open_flags::CREATE | open_flags::TRUNCATE) != 0 {
                    self.changed(&[&req.path], req.flags & open_flags::CREATE != 0);
                }
                let attr = store(file.stat())?;
                (file, attr, None)
            }
            // Only a read-only open of a missing name may run a handler.
            Err(e) if req.flags & !(open_flags::READ | open_flags::NOFOLLOW) == 0 => match self.active(&req.path, e)? {
                Found::Ready(file) => {
                    let attr = active::attr(&file)?;
                    (file, attr, None)
                }
                Found::Running(file, run) => {
                    let attr = growing_attr(&file, &run)?;
                    (file, attr, Some(run))
                }
            },
            Err(e) => return Err(e.into()),
        };
        let handle = self.next_handle;
        self.next_handle += 1;
        self.handles.insert(handle, Arc::new(file));
        if let Some(run) = run {
            self.growing.insert(handle, run);
        }
        Ok(Opened { handle, attr, location: None }.into())
    }

    fn close(&mut self, req: Close, _: Bytes) -> Reply<()> {
        self.handles.remove(&req.handle).ok_or(StoreError::BadHandle(req.handle))?;
        self.growing.remove(&req.handle);
        Ok(().into())
    }

    fn pread(&mut self, req: Pread, _: Bytes) -> Reply<()> {
        let file = self.handle(req.handle)?.clone();
        store(file.check_readable())?;
        let len = req.len.min(self.shared.config.limits.max_data.min(locus_proto::Limits::CLIENT.max_data));
        if let Some(run) = self.growing.get(&req.handle).cloned() {
            // An active file still being made: wait for bytes at the offset, or the end, and
            // answer what is there (fewer than asked, as a pipe would, so readers stream).
            if run.progress().end != Some(Ok(())) {
                return Ok(Answer::later(Box::pin(async move {
                    let p = run.wait(req.offset.saturating_add(1)).await;
                    if let Some(Err(e)) = p.end {
                        return Err(e);
                    }
                    let len = p.written.saturating_sub(req.offset).min(len as u64) as usize;
                    Ok(Answer::with_body((), Body::Bytes(store(file.pread(req.offset, len))?.into())).encode())
                })));
            }
        }
        if (len as u64) < crate::transport::SENDFILE_MIN {
            // Small reads go through memory, whose length is known after the read.
            return Ok(Answer::with_body((), Body::Bytes(store(file.pread(req.offset, len as usize))?.into())));
        }
        // sendfile needs the length before the bytes: clamp it to the file's size.
        let size = store(file.stat())?.size;
        let len = (len as u64).min(size.saturating_sub(req.offset));
        Ok(Answer::with_body((), Body::File { file, offset: req.offset, len }))
    }

    fn pwrite(&mut self, req: Pwrite, data: Bytes) -> Reply<u64> {
        let file = self.handle(req.handle)?;
        Ok(self.changing(&[&file.rel], file.pwrite(req.offset, &data))?.into())
    }

    fn get(&mut self, req: Get, _: Bytes) -> Reply<Attr> {
        self.promise(&req.path, false, Rights::READ);
        let (file, attr) = match self.shared.store.open(self.who()?, &req.path, open_flags::READ, 0) {
            Ok(file) => {
                let attr = store(file.stat())?;
                (file, attr)
            }
            Err(e) => match self.active(&req.path, e)? {
                Found::Ready(file) => {
                    let attr = active::attr(&file)?;
                    (file, attr)
                }
                Found::Running(file, run) => return self.follow(file, run),
            },
        };
        if attr.is_dir() {
            return Err(WireError::new(Code::ISDIR, format!("{}: is a directory", req.path)));
        }
        Ok(Answer::with_body(attr, Body::Stream(Arc::new(file))))
    }

    fn put(&mut self, req: Put, data: Bytes) -> Reply<Attr> {
        let who = self.who()?.to_string();
        self.start_put(&who, req, data, true, None)
    }

    fn put_cached(&mut self, req: PutCached, data: Bytes) -> Reply<Attr> {
        let who = self.who()?.to_string();
        self.start_put(&who, Put { path: req.path, mode: req.mode }, data, false, None)
    }

    fn copy(&mut self, req: CopyFile, _: Bytes) -> Reply<Attr> {
        self.copy_file(req)
    }

    fn readdir(&mut self, req: Readdir, _: Bytes) -> Reply<Vec<DirEntry>> {
        self.promise(&req.path, true, Rights::LIST);
        Ok(listing(&store(self.shared.store.readdir(self.who()?, &req.path))?))
    }

    fn mkdir(&mut self, req: Mkdir, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.mkdir(self.who()?, &req.path, req.mode))?.into())
    }

    fn rmdir(&mut self, req: Rmdir, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.rmdir(self.who()?, &req.path))?.into())
    }

    fn unlink(&mut self, req: Unlink, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.unlink(self.who()?, &req.path))?.into())
    }

    fn rename(&mut self, req: Rename, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.from, &req.to], self.shared.store.rename(self.who()?, &req.from, &req.to))?.into())
    }

    fn symlink(&mut self, req: Symlink, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.path], self.shared.store.symlink(self.who()?, &req.target, &req.path))?.into())
    }

    fn readlink(&mut self, req: Readlink, _: Bytes) -> Reply<String> {
        self.promise(&req.path, false, Rights::LIST);
        Ok(store(self.shared.store.readlink(self.who()?, &req.path))?.into())
    }

    fn link(&mut self, req: Link, _: Bytes) -> Reply<()> {
        Ok(self.naming(&[&req.from, &req.to], self.shared.store.link(self.who()?, &req.from, &req.to))?.into())
    }

    fn truncate(&mut self, req: Truncate, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.truncate(self.who()?, &req.path, req.size))?.into())
    }

    fn chmod(&mut self, req: Chmod, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.chmod(self.who()?, &req.path, req.mode))?.into())
    }

    fn utimes(&mut self, req: Utimes, _: Bytes) -> Reply<()> {
        Ok(self.changing(&[&req.path], self.shared.store.utimes(self.who()?, &req.path, req.atime, req.mtime))?.into())
    }

    fn fsync(&mut self, req: Fsync, _: Bytes) -> Reply<()> {
        Ok(store(self.handle(req.handle)?.fsync())?.into())
    }

    fn statfs(&mut self, req: Statfs, _: Bytes) -> Reply<StatFs> {
        Ok(store(self.shared.store.statfs(self.who()?, &req.path))?.into())
    }

    fn access(&mut self, req: Access, _: Bytes) -> Reply<()> {
        match self.shared.store.access(self.who()?, &req.path, req.mode) {
            Ok(()) => Ok(().into()),
            // An active file exists for reading only (asking does not wait for its run).
            Err(e) => {
                self.active(&req.path, e)?;
                if req.mode & 2 != 0 {
                    return Err(WireError::new(Code::ACCES, format!("{}: active files are read-only", req.path)));
                }
                Ok(().into())
            }
        }
    }

    fn ftruncate(&mut self, req: Ftruncate, _: Bytes) -> Reply<()> {
        let file = self.handle(req.handle)?;
        Ok(self.changing(&[&file.rel], file.ftruncate(req.size))?.into())
    }

    fn callbacks(&mut self, req: Callbacks, _: Bytes) -> Reply<u32> {
        self.who()?;
        if self.outbox.is_none() {
            return Err(WireError::new(Code::NOTSUP, "scripts do not hold callbacks"));
        }
        let to = match req.to {
            0 => self.client_id,
            to if self.shared.registry.subject(to).as_deref() == Some(self.who()?) => to,
            to => return Err(WireError::new(Code::ACCES, format!("connection {to} is not one of this subject's"))),
        };
        self.shared.callbacks.watch_export(&self.shared);
        self.callbacks_on = true;
        let who = self.who()?.to_string();
        Ok(self.shared.callbacks.enable(self.client_id, &who, req.max, to).into())
    }

    fn acl_get(&mut self, req: AclGet, _: Bytes) -> Reply<Vec<AclEntry>> {
        Ok(store(self.shared.store.acl_get(self.who()?, &req.path))?.entries.into())
    }

    fn acl_set(&mut self, req: AclSet, _: Bytes) -> Reply<()> {
        // Rights change beneath too (ACLs are inherited): every promise there breaks, so
        // its holder asks again under the new rights.
        Ok(self
            .naming(&[&req.path], self.shared.store.acl_set(self.who()?, &req.path, &req.subject, req.rights))?
            .into())
    }

    fn script_register(&mut self, req: ScriptRegister, _: Bytes) -> Reply<String> {
        self.may_execute()?;
        Ok(self.shared.scripts.register(&req.source)?.into())
    }

    fn script_call(&mut self, req: ScriptCall, data: Bytes) -> Reply<Vec<Value>> {
        let who = self.may_execute()?.to_string();
        let host = |s: &Session| -> Box<dyn locus_script::Host> {
            Box::new(crate::script_host::ScriptHost::new(s.shared.clone(), &who, s.client_id))
        };
        self.run_script(&who, req, data, host)
    }

    fn storelet_run(&mut self, req: StoreletRun, data: Bytes) -> Reply<StoreletEvent> {
        let who = self.may_execute()?.to_string();
        let view = store(self.shared.store.code_view(&who, &req.dir, req.write))?;
        let submission = crate::storelet_host::Submission {
            subject: who,
            wasm: data,
            hash: None,
            args: req.args,
            env: req.env,
            view: crate::storelet_host::Seen::Dir(view),
            write: req.write,
            record_inputs: false,
            native: None,
            active_file: None,
        };
        let (control, events) = self.shared.storelets.submit(submission)?;
        // Forget finished runs: only this list still holds their controls.
        self.storelet_runs.retain(|c| Arc::strong_count(c) > 1);
        self.storelet_runs.push(control);
        Ok(Answer::events(events))
    }

    fn handlers(&mut self, _: Handlers, _: Bytes) -> Reply<Vec<HandlerInfo>> {
        self.who()?;
        Ok(self.shared.active.list().into())
    }

    fn storelet_ps(&mut self, _: StoreletPs, _: Bytes) -> Reply<Vec<StoreletRunInfo>> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.ps(who, admin).into())
    }

    fn storelet_cancel(&mut self, req: StoreletCancel, _: Bytes) -> Reply<()> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.cancel(who, admin, req.run)?.into())
    }

    fn storelet_stats(&mut self, _: StoreletStats, _: Bytes) -> Reply<StoreletReport> {
        let (who, admin) = self.who_and_admin()?;
        Ok(self.shared.storelets.stats(who, admin).into())
    }

    fn rebalance_plan(&mut self, req: RebalancePlan, _: Bytes) -> Reply<Rebalance> {
        Ok(store(self.shared.store.rebalance_plan(self.who()?, req.max_moves))?.into())
    }

    fn rebalance_apply(&mut self, req: RebalanceApply, _: Bytes) -> Reply<Rebalance> {
        // Checked here, so an unauthorized caller is refused at once.
        self.shared.store.rebalance_plan(self.who()?, 0)?;
        // Moves copy whole files: on a thread of their own, not the connection's.
        let (shared, who) = (self.shared.clone(), self.who()?.to_string());
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::Builder::new()
            .name("locus-rebalance".into())
            .spawn(move || {
                let done = shared.store.rebalance(&who, req.max_moves);
                shared.save_accounts();
                let _ = tx.send(done);
            })
            .map_err(|e| WireError::new(Code::IO, format!("cannot start the rebalancing: {e}")))?;
        Ok(Answer::later(Box::pin(async move {
            let done = rx.await.map_err(|_| WireError::new(Code::IO, "the rebalancing stopped"))?;
            Ok(Answer::from(store(done)?).encode())
        })))
    }

    fn locate(&mut self, req: Locate, _: Bytes) -> Reply<Located> {
        let attr = self.stat(Stat { path: req.path }, Bytes::new())?.pages.remove(0);
        Ok(Located { attr, location: None }.into())
    }

    fn object_read(&mut self, req: ObjectRead, data: Bytes) -> Reply<()> {
        self.serve_object_read(req, data)
    }

    fn object_put(&mut self, req: ObjectPut, data: Bytes) -> Reply<Attr> {
        self.store_object(req, data)
    }

    fn object_drop(&mut self, req: ObjectDrop, data: Bytes) -> Reply<()> {
        self.drop_object(req, data)
    }

    fn node_run(&mut self, req: NodeRun, data: Bytes) -> Reply<StoreletEvent> {
        self.run_share(req, data)
    }

    fn object_seal(&mut self, req: ObjectSeal, data: Bytes) -> Reply<()> {
        self.seal_object(req, data)
    }

    fn object_fetch(&mut self, req: ObjectFetch, data: Bytes) -> Reply<()> {
        self.fetch_object(req, data)
    }

    fn object_write(&mut self, req: ObjectWrite, data: Bytes) -> Reply<Attr> {
        self.write_object(req, data)
    }

    fn object_adopt(&mut self, req: ObjectAdopt, data: Bytes) -> Reply<u32> {
        self.adopt_object(req, data)
    }

    fn write_begin(&mut self, _: WriteBegin, _: Bytes) -> Reply<Option<WriteTarget>> {
        Ok(None.into()) // not a head: the client puts through this server
    }

    fn write_commit(&mut self, _: WriteCommit, _: Bytes) -> Reply<Attr> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it began no third-party write"))
    }

    fn node_list(&mut self, _: NodeList, _: Bytes) -> Reply<Vec<NodeInfo>> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it has no data nodes"))
    }

    fn node_drain(&mut self, _: NodeDrain, _: Bytes) -> Reply<()> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it has no data nodes"))
    }

    fn node_remove(&mut self, _: NodeRemove, _: Bytes) -> Reply<()> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it has no data nodes"))
    }

    fn share(&mut self, _: Share, _: Bytes) -> Reply<String> {
        Err(WireError::new(Code::NOTSUP, "shared URLs are made by cluster heads (locus serve --head --http-port)"))
    }

    fn node_join(&mut self, _: NodeJoin, _: Bytes) -> Reply<NodeWelcome> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head (start one with locus serve --head)"))
    }

    fn key_rotate(&mut self, _: KeyRotate, _: Bytes) -> Reply<()> {
        Err(WireError::new(Code::NOTSUP, "this server is not a cluster head: it has no cluster key to rotate"))
    }

    fn stats(&mut self, req: Stats, _: Bytes) -> Reply<StatsReport> {
        let mut report = store(self.shared.store.stats(self.who()?, req.top))?;
        report.clients = self.shared.registry.count() as u64;
        let callbacks = &self.shared.callbacks;
        (report.promises_held, report.promises_refused) = (callbacks.held() as u64, callbacks.refused());
        report.watches = callbacks.watches() as u64;
        Ok(report.into())
    }
}
