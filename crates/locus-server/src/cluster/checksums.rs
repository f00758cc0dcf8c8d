//! Checksums of the versions a data node keeps, so that a flipped bit on a node's disk
//! is found and repaired from a replica, never served.
//!
//! Beside each version `OBJECT.VERSION` lies `OBJECT.VERSION.crc`: the CRC-32 of the
//! whole version, then the CRC-32 of every [`BLOCK`] of it, little-endian, one after
//! another (as HDFS keeps a checksum per chunk, so a read checks only the blocks it
//! covers). A version with checksums is sealed: it is never sealed again otherwise,
//! written over, or removed by a failed seal. The node writes it when the head
//! seals the version (checking the whole file against the CRC the head computed of the
//! bytes it sent), and checks it on every read and in the scrub. A damaged version is
//! moved to [`DAMAGED_DIR`] (so no read gets it again) and reported to the head at the
//! node's next heartbeat; the head copies the version from a replica.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// The bytes each checksum covers.
pub const BLOCK: u64 = 64 << 10;

/// The suffix of a version's checksum file.
pub const SUFFIX: &str = ".crc";

/// Where damaged versions go, under the node's objects directory.
pub const DAMAGED_DIR: &str = "damaged";

/// Why a version failed its check.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("checksum mismatch in block {block}: the node's copy is damaged")]
    Mismatch { block: u64 },
    #[error("the node's copy has CRC-32 {found:08x}, the head sent {expected:08x}")]
    Whole { found: u32, expected: u32 },
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// The checksum file of the version at `object_file`.
pub fn sidecar(object_file: &Path) -> PathBuf {
    let mut name = object_file.as_os_str().to_owned();
    name.push(SUFFIX);
    PathBuf::from(name)
}

/// The block checksums and the whole file's CRC-32 of `file`.
pub fn compute(file: &File) -> io::Result<(Vec<u32>, u32)> {
    let mut sums = Vec::new();
    let mut whole = crc32fast::Hasher::new();
    let mut buf = vec![0u8; BLOCK as usize];
    let mut at = 0u64;
    loop {
        let n = read_full(file, &mut buf, at)?;
        if n == 0 {
            break;
        }
        sums.push(crc32fast::hash(&buf[..n]));
        whole.update(&buf[..n]);
        at += n as u64;
    }
    Ok((sums, whole.finalize()))
}

/// Reads until `buf` is full or the file ends; answers how many bytes.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64)? {
            0 => break,
            m => n += m,
        }
    }
    Ok(n)
}

/// Writes the checksums of the version at `object_file` durably, after checking its
/// whole CRC-32 against `expected` (when given); a mismatch leaves no checksum file. A
/// version sealed already is only compared: its stored CRC-32 against `expected`.
pub fn seal(object_file: &Path, expected: Option<u32>) -> Result<(), CheckError> {
    let to = sidecar(object_file);
    if let Some(found) = sealed_crc(object_file)? {
        return match expected.filter(|e| *e != found) {
            Some(expected) => Err(CheckError::Whole { found, expected }),
            None => Ok(()),
        };
    }
    let (sums, whole) = compute(&File::open(object_file)?)?;
    if let Some(expected) = expected.filter(|e| *e != whole) {
        return Err(CheckError::Whole { found: whole, expected });
    }
    let mut tmp = to.clone().into_os_string();
    tmp.push(".tmp");
    let bytes: Vec<u8> = std::iter::once(whole).chain(sums).flat_map(|s| s.to_le_bytes()).collect();
    let file = File::create(&tmp)?;
    file.write_all_at(&bytes, 0)?;
    file.sync_all()?;
    std::fs::rename(&tmp, &to)?;
    Ok(())
}

/// The whole CRC-32 a sealed version was sealed with; `None` if it has no checksums.
pub fn sealed_crc(object_file: &Path) -> io::Result<Option<u32>> {
    let file = match File::open(sidecar(object_file)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut raw = [0u8; 4];
    match read_full(&file, &mut raw, 0)? {
        4 => Ok(Some(u32::from_le_bytes(raw))),
        _ => Err(io::Error::new(io::ErrorKind::InvalidData, "a checksum file without its header")),
    }
}

/// The checksums of blocks `first..=last` of the version at `object_file`, or `None`
/// when it has none (stored before checksums; the scrub gives it some).
fn load(object_file: &Path, first: u64, last: u64) -> io::Result<Option<Vec<u32>>> {
    let file = match File::open(sidecar(object_file)) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut raw = vec![0u8; ((last - first + 1) * 4) as usize];
    let n = read_full(&file, &mut raw, 4 + first * 4)?;
    raw.truncate(n);
    Ok(Some(raw.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("four bytes"))).collect()))
}

/// Reads `len` bytes at `offset` of the version at `object_file` (open as `file`),
/// checking every block it touches; answers the bytes (fewer at the end of the file).
pub fn read_checked(object_file: &Path, file: &File, offset: u64, len: u64) -> Result<Vec<u8>, CheckError> {
    let size = file.metadata()?.len();
    let end = offset.saturating_add(len).min(size);
    if end <= offset {
        return Ok(Vec::new());
    }
    let (first, last) = (offset / BLOCK, (end - 1) / BLOCK);
    let start = first * BLOCK;
    let mut buf = vec![0u8; ((last + 1) * BLOCK).min(size).saturating_sub(start) as usize];
    let n = read_full(file, &mut buf, start)?;
    buf.truncate(n);
    if let Some(sums) = load(object_file, first, last)? {
        for (i, chunk) in buf.chunks(BLOCK as usize).enumerate() {
            if sums.get(i) != Some(&crc32fast::hash(chunk)) {
                return Err(CheckError::Mismatch { block: first + i as u64 });
            }
        }
    }
    buf.drain(..(offset - start) as usize);
    buf.truncate((end - offset) as usize);
    Ok(buf)
}

/// Checks a whole version against its checksums; one without any is given them (a
/// version stored before checksums existed).
pub fn scrub_one(object_file: &Path) -> Result<(), CheckError> {
    let file = File::open(object_file)?;
    let (sums, _) = compute(&file)?;
    let blocks = sums.len() as u64;
    match load(object_file, 0, blocks.saturating_sub(1))? {
        None => seal(object_file, None),
        Some(stored) => match (0..sums.len()).find(|&i| stored.get(i) != Some(&sums[i])) {
            Some(block) => Err(CheckError::Mismatch { block: block as u64 }),
            None if stored.len() != sums.len() => Err(CheckError::Mismatch { block: blocks }),
            None => Ok(()),
        },
    }
}

/// Moves a damaged version (and its checksums) out of the objects directory `objects`,
/// so that no read is given it again.
pub fn quarantine(objects: &Path, name: &str) {
    let to = objects.join(DAMAGED_DIR);
    let _ = std::fs::create_dir_all(&to);
    for suffix in ["", SUFFIX] {
        let from = objects.join(format!("{name}{suffix}"));
        if let Err(e) = std::fs::rename(&from, to.join(format!("{name}{suffix}"))) {
            if e.kind() != io::ErrorKind::NotFound {
                tracing::warn!("cannot move the damaged {} aside: {e}", from.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_checked_block_by_block_and_a_flipped_bit_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("7.9");
        let data: Vec<u8> = (0..(3 * BLOCK + 100) as u32).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let whole = crc32fast::hash(&data);
        assert!(matches!(seal(&path, Some(whole ^ 1)), Err(CheckError::Whole { .. })));
        assert!(!sidecar(&path).exists());
        seal(&path, Some(whole)).unwrap();
        // Sealed: sealing again only compares, and a wrong CRC changes nothing.
        assert_eq!(sealed_crc(&path).unwrap(), Some(whole));
        seal(&path, Some(whole)).unwrap();
        assert!(matches!(seal(&path, Some(whole ^ 1)), Err(CheckError::Whole { .. })));
        assert!(path.exists() && sidecar(&path).exists());
        let file = File::open(&path).unwrap();
        let got = read_checked(&path, &file, BLOCK - 10, BLOCK + 20).unwrap();
        assert_eq!(got, data[(BLOCK - 10) as usize..(2 * BLOCK + 10) as usize]);
        assert_eq!(read_checked(&path, &file, 3 * BLOCK + 90, 1000).unwrap(), data[(3 * BLOCK + 90) as usize..]);
        scrub_one(&path).unwrap();

        // One bit flipped in block 2: reads touching it fail, others still work.
        let mut bad = data.clone();
        bad[(2 * BLOCK + 5) as usize] ^= 0x10;
        std::fs::write(&path, &bad).unwrap();
        let file = File::open(&path).unwrap();
        assert!(matches!(read_checked(&path, &file, 2 * BLOCK, 10), Err(CheckError::Mismatch { block: 2 })));
        assert_eq!(read_checked(&path, &file, 0, 10).unwrap(), data[..10]);
        assert!(matches!(scrub_one(&path), Err(CheckError::Mismatch { block: 2 })));
        quarantine(dir.path(), "7.9");
        assert!(!path.exists() && dir.path().join(DAMAGED_DIR).join("7.9.crc").exists());
    }
}
