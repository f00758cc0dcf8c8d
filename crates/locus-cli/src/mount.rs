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
    let fs = LocusFs::new(driver, &path, options);
    let options = [
        fuser::MountOption::FSName(url.to_string()),
        fuser::MountOption::Subtype("locus".into()),
        fuser::MountOption::NoAtime,
    ];
    let mountpoint = &mountpoint.canonicalize().map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    let notifier = fs.notifier_slot();
    let session =
        fuser::spawn_mount2(fs, mountpoint, &options).map_err(|e| format!("mount on {}: {e}", mountpoint.display()))?;
    let _ = notifier.set(session.notifier());
    eprintln!("{url} is mounted on {}; Ctrl-C or `locus umount` to unmount", mountpoint.display());
    wait_for_signal_or_unmount(mountpoint);
    if is_mounted(mountpoint) {
        // Dropping the session unmounts and ends its thread.
        drop(session);
    } else {
        // Unmounted from outside (`locus umount`): there is nothing left to undo.
        std::mem::forget(session);
    }
    Ok(())
}

/// Returns on SIGINT or SIGTERM, or once the mount point is no longer mounted.
fn wait_for_signal_or_unmount(mountpoint: &Path) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let unmounted = async {
            while is_mounted(mountpoint) {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = unmounted => {}
        }
    });
}

/// `locus umount MOUNTPOINT`: asks the kernel to unmount; the `locus mount` process ends.
pub fn umount(mountpoint: &Path) -> Result<(), String> {
    let status = std::process::Command::new("fusermount3").arg("-u").arg(mountpoint).status();
    match status {
        Ok(s) if s.success() => Ok(()),
        _ => rustix::mount::unmount(mountpoint, rustix::mount::UnmountFlags::empty())
            .map_err(|e| format!("unmount {}: {e}", mountpoint.display())),
    }
}
