//! `locus bench mount --fuse-transport`: which FUSE transports the afs targets are
//! measured over, and the kernel's io_uring setting while they are.

use crate::BenchError;

/// The FUSE transports the afs targets are measured over, and each one's name suffix.
pub(crate) fn transports(choice: &str) -> Vec<(&str, &str)> {
    match choice {
        "both" => vec![("classic", " (/dev/fuse)"), ("uring", " (io_uring)")],
        other => vec![(other, "")],
    }
}

/// Turns FUSE over io_uring on while the bench runs; off again when dropped, if it was.
pub(crate) struct UringSetting(Option<String>);

impl UringSetting {
    pub(crate) fn on(wanted: bool) -> Result<UringSetting, BenchError> {
        let path = locus_fuse::URING_SETTING;
        if !wanted {
            return Ok(UringSetting(None));
        }
        let was = std::fs::read_to_string(path)
            .map_err(|e| BenchError::Setup(format!("{path}: {e} (FUSE over io_uring needs Linux 6.14 or later)")))?;
        std::fs::write(path, "Y").map_err(|e| BenchError::Setup(format!("turning on {path}: {e} (needs root)")))?;
        Ok(UringSetting(Some(was.trim().to_string())))
    }
}

impl Drop for UringSetting {
    fn drop(&mut self) {
        if let Some(was) = self.0.as_deref().filter(|w| *w != "Y") {
            let _ = std::fs::write(locus_fuse::URING_SETTING, was);
        }
    }
}
