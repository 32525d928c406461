//! Receiving a file from the host (`lab cp`): chunks are written in order to
//! a hidden temporary file next to the destination, which is given its mode
//! and renamed into place when the last chunk lands, so a torn transfer never
//! leaves a half-written file under the real name. One transfer at a time;
//! a chunk at offset 0 starts over.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use vmscope_protocol::{ErrorKind, Response};

struct Transfer {
    path: PathBuf,
    tmp: PathBuf,
    file: File,
    written: u64,
}

/// State of the file transfer in progress, if any.
#[derive(Default)]
pub struct PutFiles {
    current: Option<Transfer>,
}

fn error(kind: ErrorKind, message: String) -> Response {
    Response::Error { kind, message }
}

impl PutFiles {
    /// Abandons a transfer in progress (host gone), removing its temporary file.
    pub fn abort(&mut self) {
        if let Some(t) = self.current.take() {
            drop(t.file);
            let _ = std::fs::remove_file(&t.tmp);
        }
    }

    /// Handles one chunk; the request fields were validated by the decoder.
    pub fn chunk(
        &mut self,
        path: &str,
        mode: u32,
        offset: u64,
        data: &[u8],
        last: bool,
    ) -> Response {
        let path = Path::new(path);
        if offset == 0 {
            self.abort();
            let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
                return error(
                    ErrorKind::BadRequest,
                    format!("{} names no file", path.display()),
                );
            };
            let tmp = dir.join(format!(
                ".{}.vmscope-part-{}",
                name.to_string_lossy(),
                std::process::id()
            ));
            let file = match OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)
            {
                Ok(f) => f,
                Err(e) => {
                    return error(
                        ErrorKind::Io,
                        format!("cannot create {}: {e}", tmp.display()),
                    )
                }
            };
            self.current = Some(Transfer {
                path: path.to_path_buf(),
                tmp,
                file,
                written: 0,
            });
        }
        let Some(t) = self.current.as_mut() else {
            return error(
                ErrorKind::BadRequest,
                format!(
                    "chunk at offset {offset} of {} without a transfer started at offset 0",
                    path.display()
                ),
            );
        };
        if t.path != path || t.written != offset {
            let msg = format!(
                "chunk for {} at offset {offset} does not continue the transfer of {} at {}",
                path.display(),
                t.path.display(),
                t.written
            );
            self.abort();
            return error(ErrorKind::BadRequest, msg);
        }
        if let Err(e) = t.file.write_all(data) {
            let msg = format!("cannot write {}: {e}", t.tmp.display());
            self.abort();
            return error(ErrorKind::Io, msg);
        }
        t.written += data.len() as u64;
        let written = t.written;
        if last {
            let Some(t) = self.current.take() else {
                return error(ErrorKind::Io, "transfer vanished".into());
            };
            let finish = t
                .file
                .set_permissions(std::fs::Permissions::from_mode(mode))
                .and_then(|_| t.file.sync_all())
                .and_then(|_| std::fs::rename(&t.tmp, &t.path));
            if let Err(e) = finish {
                let _ = std::fs::remove_file(&t.tmp);
                return error(
                    ErrorKind::Io,
                    format!("cannot finish {}: {e}", t.path.display()),
                );
            }
        }
        Response::PutFileDone { bytes: written }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_assemble_and_out_of_order_is_refused() {
        let dir = std::env::temp_dir().join(format!("vmscope-put-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let dest = dir.join("f");
        let p = dest.to_str().unwrap();
        let mut puts = PutFiles::default();
        assert_eq!(
            puts.chunk(p, 0o640, 0, b"abc", false),
            Response::PutFileDone { bytes: 3 }
        );
        assert!(!dest.exists(), "not visible before the last chunk");
        assert!(matches!(
            puts.chunk(p, 0o640, 5, b"x", false),
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ));
        assert!(puts.current.is_none(), "an out-of-order chunk aborts");
        assert_eq!(
            puts.chunk(p, 0o640, 0, b"abc", false),
            Response::PutFileDone { bytes: 3 }
        );
        assert_eq!(
            puts.chunk(p, 0o640, 3, b"de", true),
            Response::PutFileDone { bytes: 5 }
        );
        assert_eq!(std::fs::read(&dest).unwrap(), b"abcde");
        let mode = std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o640);
        assert_eq!(
            std::fs::read_dir(&dir).unwrap().count(),
            1,
            "no temporary left"
        );
        let missing = dir.join("no/such/dir/f");
        assert!(matches!(
            puts.chunk(missing.to_str().unwrap(), 0o600, 0, b"", true),
            Response::Error {
                kind: ErrorKind::Io,
                ..
            }
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
