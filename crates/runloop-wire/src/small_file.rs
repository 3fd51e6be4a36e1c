//! Small files an operator names — a server's configuration and token
//! files, a TLS certificate, its key, a certificate authority — read
//! whole, within a size bound, and only when they are regular files.
//!
//! Such a path is read at startup, by `--check-config`, and again on each
//! SIGHUP while the server serves. Whatever sits at the path is read:
//! a FIFO with no writer blocks `open(2)` until something writes to it,
//! and a device such as `/dev/zero` never ends. So the file is opened
//! without blocking (`O_NONBLOCK`: a FIFO's open returns at once), looked
//! at through its open descriptor (`fstat`, so nothing can be swapped in
//! between a check and the open), refused unless it is a regular file,
//! and read to at most its bound: a file that grows past it while it is
//! read is refused too, never read on. Each caller names the bound that
//! fits its files ([`crate::tls::MAX_PEM_FILE`] for PEM). A reload that
//! reads them runs off the server's async workers as well (`runloop
//! serve`'s SIGHUP handler), so even a slow disk holds up no connection.

use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Why a file was not read.
#[derive(Debug, thiserror::Error)]
pub enum SmallFileError {
    /// It could not be opened or read: the system's error.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// It is not a regular file (a FIFO, a device, a socket, a directory).
    #[error("it is {0}, not a regular file")]
    NotRegular(&'static str),
    /// It is larger than the bound.
    #[error("it is larger than {0} bytes, more than such a file ever needs")]
    TooLarge(u64),
    /// It is not UTF-8 text.
    #[error("it is not UTF-8 text")]
    NotText,
}

/// The text of the regular file at `path`, at most `max` bytes; never
/// blocks on what is not a regular file.
pub fn read(path: &Path, max: u64) -> Result<String, SmallFileError> {
    String::from_utf8(read_bytes(path, max)?).map_err(|_| SmallFileError::NotText)
}

/// The bytes of the regular file at `path`, at most `max` of them; never
/// blocks on what is not a regular file.
pub fn read_bytes(path: &Path, max: u64) -> Result<Vec<u8>, SmallFileError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    let kind = file.metadata()?.file_type();
    if !kind.is_file() {
        return Err(SmallFileError::NotRegular(what(kind)));
    }
    if file.metadata()?.len() > max {
        return Err(SmallFileError::TooLarge(max));
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(SmallFileError::TooLarge(max));
    }
    Ok(bytes)
}

/// What a file that is not a regular file is, in words.
fn what(kind: std::fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO (named pipe)"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "something else"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bound of the size the server's files have.
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_regular_file_is_read_and_anything_else_is_refused_at_once() {
        let dir = tempfile::tempdir().expect("a directory");
        let text = dir.path().join("tokens");
        std::fs::write(&text, "a\nb\n").expect("written");
        assert_eq!(read(&text, 16).expect("read"), "a\nb\n");

        // A FIFO with no writer: refused without waiting for one.
        let fifo = dir.path().join("fifo");
        let name = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("a path");
        // SAFETY: a system call on a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
        let refused = read(&fifo, MIB).expect_err("a FIFO");
        assert_eq!(
            refused.to_string(),
            "it is a FIFO (named pipe), not a regular file"
        );

        // A device that never ends, and a directory.
        let zero = read(Path::new("/dev/zero"), MIB).expect_err("a device");
        assert_eq!(
            zero.to_string(),
            "it is a character device, not a regular file"
        );
        assert!(matches!(
            read(dir.path(), 16),
            Err(SmallFileError::NotRegular("a directory"))
        ));
    }

    #[test]
    fn a_file_past_its_bound_is_refused_unread() {
        let dir = tempfile::tempdir().expect("a directory");
        let large = dir.path().join("large");
        // Sparse: a gigabyte that takes no disk.
        let file = std::fs::File::create(&large).expect("created");
        file.set_len(1 << 30).expect("grown");
        let refused = read(&large, MIB).expect_err("too large");
        assert!(matches!(refused, SmallFileError::TooLarge(MIB)));
        std::fs::write(&large, [b'x'; 17]).expect("written");
        assert!(read(&large, 16).is_err());
        assert_eq!(read(&large, 17).expect("at the bound").len(), 17);
        std::fs::write(&large, [0xff, 0xfe]).expect("written");
        assert!(matches!(read(&large, 16), Err(SmallFileError::NotText)));
    }

    #[test]
    fn no_small_file_error_says_its_cause_twice() {
        let errors = [
            SmallFileError::Io(io::Error::from(io::ErrorKind::PermissionDenied)),
            SmallFileError::NotRegular("a FIFO (named pipe)"),
            SmallFileError::TooLarge(MIB),
            SmallFileError::NotText,
        ];
        for error in &errors {
            runloop_testkit::errors::assert_cause_said_once(error);
        }
    }
}
