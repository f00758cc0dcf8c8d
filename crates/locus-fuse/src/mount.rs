//! Mounting: /dev/fuse opened and mounted with `mount(2)` where we may (as root, or in
//! a user namespace of our own), else by `fusermount3`, which mounts for unprivileged
//! users and hands the descriptor back over a socket.

use crate::{Filesystem, Notifier, Session, Transport, TransportChoice};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;

/// How the mount shows in the mount table, and how it behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountOption {
    /// The source column of the mount table (`locus://host:9610/`).
    FSName(String),
    /// The type shows as `fuse.SUBTYPE`.
    Subtype(String),
    /// Access times are not updated.
    NoAtime,
}

/// A mounted file system served on a thread of its own.
pub struct BackgroundSession {
    /// The serving thread: ends when the file system is unmounted.
    pub guard: JoinHandle<io::Result<()>>,
    notifier: Notifier,
    transport: Arc<OnceLock<Transport>>,
}

impl BackgroundSession {
    /// Sends notifications to the kernel for this mount.
    pub fn notifier(&self) -> Notifier {
        self.notifier.clone()
    }

    /// Where the transport appears once the kernel's INIT is answered.
    pub fn transport(&self) -> Arc<OnceLock<Transport>> {
        self.transport.clone()
    }
}

/// Mounts `fs` on `mountpoint` and serves it on a new thread over `transport`.
pub fn mount<F: Filesystem + Send + 'static>(
    fs: F,
    mountpoint: &Path,
    options: &[MountOption],
    transport: TransportChoice,
) -> io::Result<BackgroundSession> {
    let fuse = mount_fuse(mountpoint, options)?;
    let session = Session::new(fs, fuse, transport);
    let notifier = session.notifier();
    let transport = session.transport();
    let guard = std::thread::Builder::new().name("fuse".into()).spawn(move || session.run())?;
    Ok(BackgroundSession { guard, notifier, transport })
}

/// Opens /dev/fuse and mounts it on `mountpoint`.
fn mount_fuse(mountpoint: &Path, options: &[MountOption]) -> io::Result<OwnedFd> {
    let fuse = rustix::fs::open(
        "/dev/fuse",
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| io::Error::new(io::Error::from(e).kind(), format!("/dev/fuse: {e}")))?;
    let mut source = "locus".to_string();
    let mut fstype = "fuse".to_string();
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    for o in options {
        match o {
            MountOption::FSName(name) => source = name.clone(),
            MountOption::Subtype(sub) => fstype = format!("fuse.{sub}"),
            MountOption::NoAtime => flags |= libc::MS_NOATIME,
        }
    }
    let data = format!(
        "fd={},rootmode=40000,user_id={},group_id={}",
        fuse.as_raw_fd(),
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw()
    );
    let c =
        |s: &str| CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in a mount option"));
    let target = CString::new(mountpoint.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the mount point"))?;
    let (source_c, fstype_c, data_c) = (c(&source)?, c(&fstype)?, c(&data)?);
    // SAFETY: every pointer is a live NUL-terminated string.
    let mounted =
        unsafe { libc::mount(source_c.as_ptr(), target.as_ptr(), fstype_c.as_ptr(), flags, data_c.as_ptr().cast()) };
    if mounted == 0 {
        return Ok(fuse);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() != Some(libc::EPERM) {
        return Err(io::Error::new(e.kind(), format!("mount on {}: {e}", mountpoint.display())));
    }
    drop(fuse);
    by_fusermount(mountpoint, options)
}

/// Mounts through `fusermount3` (setuid root), which sends the descriptor back.
fn by_fusermount(mountpoint: &Path, options: &[MountOption]) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    rustix::io::fcntl_setfd(&theirs, rustix::io::FdFlags::empty())?;
    let mut opts = vec![];
    for o in options {
        match o {
            // fusermount3 splits its options at commas; a backslash keeps the next
            // character (a comma, or a backslash) as it is.
            MountOption::FSName(name) => {
                opts.push(format!("fsname={}", name.replace('\\', "\\\\").replace(',', "\\,")))
            }
            MountOption::Subtype(sub) => opts.push(format!("subtype={sub}")),
            MountOption::NoAtime => opts.push("noatime".into()),
        }
    }
    let mut command = std::process::Command::new("fusermount3");
    if !opts.is_empty() {
        command.arg("-o").arg(opts.join(","));
    }
    let status = command
        .arg("--")
        .arg(mountpoint)
        .env("_FUSE_COMMFD", theirs.as_raw_fd().to_string())
        .status()
        .map_err(|e| io::Error::new(e.kind(), format!("mount needs root or fusermount3 (package fuse3): {e}")))?;
    drop(theirs);
    if !status.success() {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("fusermount3 could not mount {}", mountpoint.display()),
        ));
    }
    receive_fd(&ours)
}

/// The descriptor fusermount3 sends (SCM_RIGHTS).
fn receive_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags};
    let mut byte = [0u8; 1];
    let mut space = [std::mem::MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    rustix::net::recvmsg(socket.as_fd(), &mut [io::IoSliceMut::new(&mut byte)], &mut control, RecvFlags::CMSG_CLOEXEC)?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(mut fds) = message {
            if let Some(fd) = fds.next() {
                // Own it as a plain descriptor (the type is the same).
                // SAFETY: `into_raw_fd` gives up ownership, taken again here.
                return Ok(unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(fd)) });
            }
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidData, "fusermount3 sent no descriptor"))
}
