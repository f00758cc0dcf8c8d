//! `locus mount` and `locus umount`.

use locus_mount::{is_mounted, LocusFs, MountOptions};
use std::path::Path;
use std::time::Duration;

/// Mounts `url` (`locus://`, `chirp://`, `http(s)://`) on `mountpoint` and serves it
/// until it is unmounted or a signal comes.
pub fn run(url: &str, mountpoint: &Path, options: MountOptions, retry: Duration) -> Result<(), String> {
    let (mut driver, path) = locus_drivers::connect(url).map_err(|e| format!("{url}: {e}"))?;
    driver.set_retry(retry);
    let attr = driver.lstat(&path).map_err(|e| format!("{url}: {e}"))?;
    if attr.mode & locus_client::types::S_IFMT != locus_client::types::S_IFDIR {
        return Err(format!("{url}: not a directory"));
    }
    let transport = options.transport;
    let mut fs = LocusFs::new(driver, &path, options);
    let options = [
        locus_fuse::MountOption::FSName(url.to_string()),
        locus_fuse::MountOption::Subtype("locus".into()),
        locus_fuse::MountOption::NoAtime,
    ];
    let mountpoint = &mountpoint.canonicalize().map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    fs.freshen_through(mountpoint.clone());
    let notifier = fs.notifier_slot();
    let control = fs.control();
    let session = locus_fuse::mount(fs, mountpoint, &options, transport)
        .map_err(|e| format!("mount on {}: {e}", mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
    // The kernel's INIT comes at once; its answer says how requests come.
    let chosen = session.transport();
    let started = std::time::Instant::now();
    while chosen.get().is_none() && !session.guard.is_finished() && started.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    if session.guard.is_finished() {
        let ended = session.guard.join().unwrap_or_else(|_| Err(std::io::Error::other("the FUSE thread panicked")));
        detach(mountpoint);
        return Err(format!(
            "mount on {}: {}",
            mountpoint.display(),
            ended.err().map_or("ended".into(), |e| e.to_string())
        ));
    }
    let by = chosen.get().map_or(String::new(), |t| format!(" ({t})"));
    eprintln!("{url} is mounted on {}{by}; Ctrl-C or `locus umount` to unmount", mountpoint.display());
    let signalled = wait_for_signal_or_unmount(mountpoint, &control);
    if signalled {
        // Everything unsaved is stored before the mount goes (the mount takes the
        // request at the statfs it answers), then the mount point is detached: at once
        // if nothing is open on it, else lazily (what is written on files still open
        // after the store stays journaled in the cache directory for the next mount).
        control.request_store();
        let _ = rustix::fs::statfs(mountpoint);
        if umount(mountpoint).is_err() {
            detach(mountpoint);
            // The FUSE loop lives on while files stay open: not waited for.
            std::mem::forget(session);
            return Ok(());
        }
    }
    // Unmounted (from outside, or just now): the FUSE loop ends, and its `destroy`
    // stores whatever is still unsaved before the process ends.
    let guard = session.guard;
    let _ = guard.join();
    Ok(())
}

/// Returns true on SIGINT or SIGTERM, false once the mount point is no longer mounted.
/// Meanwhile, while the mount holds copies whose store failed, it is prodded (a statfs)
/// every few seconds so that it tries them again even when nothing uses it.
fn wait_for_signal_or_unmount(mountpoint: &Path, control: &std::sync::Arc<locus_mount::Control>) -> bool {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let unmounted = async {
            let mut prodded = std::time::Instant::now();
            while is_mounted(mountpoint) {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if control.unsaved() > 0 && prodded.elapsed() >= Duration::from_secs(5) {
                    prodded = std::time::Instant::now();
                    let at = mountpoint.to_path_buf();
                    // On a thread of its own: it waits as long as a store does.
                    std::thread::spawn(move || rustix::fs::statfs(&at));
                }
            }
        };
        tokio::select! {
            _ = term.recv() => true,
            _ = int.recv() => true,
            _ = unmounted => false,
        }
    })
}

/// Detaches the mount point lazily (files open on it keep it until they are closed).
fn detach(mountpoint: &Path) {
    if rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::DETACH).is_ok() {
        return;
    }
    let _ = std::process::Command::new("fusermount3").arg("-u").arg("-z").arg(mountpoint).status();
}

/// `locus umount MOUNTPOINT`: asks the kernel to unmount; the `locus mount` process ends.
pub fn umount(mountpoint: &Path) -> Result<(), String> {
    let status = std::process::Command::new("fusermount3")
        .arg("-u")
        .arg(mountpoint)
        .stderr(std::process::Stdio::null())
        .status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty())
            .map_err(|e| format!("unmount {}: {e}", mountpoint.display())),
    }
}
