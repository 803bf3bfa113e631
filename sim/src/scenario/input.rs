//! Reading what a user hands the simulator — scenario, bounds and trace
//! files, shard and tune-state JSON — within bounds: regular files only (a
//! device such as `/dev/zero` or a FIFO would be read without end), and at
//! most [`max_input_bytes`], checked before anything is read and enforced
//! while reading, so no input sizes an allocation beyond it.

use std::fs::File;
use std::io::{self, Read as _};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// The default bound on one input: 1 GiB, several times a trace of five
/// million requests in BurstGPT's layout (about 45 bytes a row).
pub const DEFAULT_MAX_INPUT_BYTES: u64 = 1 << 30;

static MAX_INPUT_BYTES: AtomicU64 = AtomicU64::new(DEFAULT_MAX_INPUT_BYTES);

/// The most bytes one input may have.
pub fn max_input_bytes() -> u64 {
    MAX_INPUT_BYTES.load(Ordering::Relaxed)
}

/// Sets the bound for the rest of the process (`--max-input-mb`).
pub fn set_max_input_bytes(bytes: u64) {
    MAX_INPUT_BYTES.store(bytes, Ordering::Relaxed);
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, why)
}

/// Opens `path` for reading: a regular file (symlinks followed) of at most
/// [`max_input_bytes`], read no further than that.
pub fn open(path: &Path) -> io::Result<io::Take<File>> {
    // Asked before opening: opening a FIFO with no writer blocks.
    if !std::fs::metadata(path)?.is_file() {
        return Err(refused(
            "not a regular file (a device, FIFO or directory is not read)".into(),
        ));
    }
    let file = File::open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(refused(
            "not a regular file (a device, FIFO or directory is not read)".into(),
        ));
    }
    let limit = max_input_bytes();
    if meta.len() > limit {
        return Err(refused(format!(
            "{} bytes, above the input limit of {limit} bytes (raise it with --max-input-mb)",
            meta.len()
        )));
    }
    // One byte past the limit tells a file that grew while read.
    Ok(file.take(limit.saturating_add(1)))
}

/// Reads `path` whole as UTF-8 text, within the bounds of [`open`].
pub fn read_text(path: &Path) -> io::Result<String> {
    let mut text = String::new();
    open(path)?.read_to_string(&mut text)?;
    if text.len() as u64 > max_input_bytes() {
        return Err(refused(format!(
            "grew past the input limit of {} bytes while read",
            max_input_bytes()
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_is_refused_before_a_byte_is_read() {
        let e = read_text(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}
