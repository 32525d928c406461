//! The guest's kernel symbols for the host (protocol 2): a snapshot of
//! `/proc/kallsyms` and the names in `/proc/modules`, taken when the host
//! asks for offset 0 and sent in slices of [`KALLSYMS_CHUNK`] bytes that end
//! at line ends. Needs no sampling, so passive guests can answer it.
//!
//! Also the parsed table a profiling session symbolizes the guest's kernel
//! with ([`session_kernel`]), kept between sessions: reading
//! `/proc/kallsyms` costs an emulated guest about 0.1 s of CPU, most of a
//! short session's start-up.

use std::path::Path;

use vmscope_protocol::{
    ErrorKind, Response, KALLSYMS_CHUNK, MAX_KALLSYMS_TOTAL, MAX_MODULES, MAX_MODULE_NAME,
};

use crate::server::cut;

/// One reading of the guest's kernel symbols.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// `/proc/kallsyms` as read.
    pub text: String,
    /// First field of each `/proc/modules` line.
    pub modules: Vec<String>,
}

/// Reads `kallsyms` and `modules` under `proc_root`; a missing module list
/// (a kernel without modules) is an empty one.
pub fn read(proc_root: &Path) -> Result<Snapshot, Response> {
    let path = proc_root.join("kallsyms");
    let text = std::fs::read_to_string(&path).map_err(|e| Response::Error {
        kind: ErrorKind::Io,
        message: format!("cannot read {} in the guest: {e}", path.display()),
    })?;
    if text.len() as u64 > MAX_KALLSYMS_TOTAL {
        return Err(Response::Error {
            kind: ErrorKind::TooLarge,
            message: format!(
                "{} is {} bytes, limit {MAX_KALLSYMS_TOTAL}",
                path.display(),
                text.len()
            ),
        });
    }
    let modules = std::fs::read_to_string(proc_root.join("modules"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .take(MAX_MODULES)
        .map(|m| cut(m.to_string(), MAX_MODULE_NAME))
        .collect();
    Ok(Snapshot { text, modules })
}

/// The kernel table kept from an earlier session, with what it was read
/// under: the module list and the loaded BPF programs.
struct KeptKernel {
    modules: String,
    bpf: Vec<u32>,
    kernel: vmscope_symbols::Kallsyms,
}

static KEPT: std::sync::Mutex<Option<KeptKernel>> = std::sync::Mutex::new(None);

/// The ids of the loaded BPF programs (`BPF_PROG_GET_NEXT_ID`), `None`
/// when the kernel will not say (no BPF syscall, no permission). Ids are
/// never reused while the kernel runs, so an equal list means the same
/// programs, and so the same `[bpf]` lines in kallsyms.
fn bpf_prog_ids() -> Option<Vec<u32>> {
    /// The part of `union bpf_attr` that `BPF_PROG_GET_NEXT_ID` uses.
    #[repr(C)]
    struct NextId {
        start_id: u32,
        next_id: u32,
        open_flags: u32,
    }
    const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
    let mut ids = Vec::new();
    let mut start = 0u32;
    loop {
        let mut attr = NextId {
            start_id: start,
            next_id: 0,
            open_flags: 0,
        };
        // SAFETY: the command reads start_id and writes next_id of the
        // attribute block given, whose size is passed with it.
        let r = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_PROG_GET_NEXT_ID,
                &raw mut attr,
                std::mem::size_of::<NextId>(),
            )
        };
        if r != 0 {
            let end = std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOENT);
            return end.then_some(ids);
        }
        if attr.next_id <= start || ids.len() >= 1 << 20 {
            return None;
        }
        ids.push(attr.next_id);
        start = attr.next_id;
    }
}

/// The guest kernel's symbols under `proc_root` for a profiling session,
/// and whether they were kept from an earlier one: reused while the module
/// list and the loaded BPF programs are the same (code loaded during a
/// session arrives as ksymbol records). Where the BPF programs cannot be
/// listed, read every time.
pub fn session_kernel(
    proc_root: &Path,
) -> (
    Result<vmscope_symbols::Kallsyms, vmscope_symbols::SymbolError>,
    bool,
) {
    let modules = std::fs::read_to_string(proc_root.join("modules")).unwrap_or_default();
    let bpf = bpf_prog_ids();
    if let (Some(ids), Ok(kept)) = (&bpf, KEPT.lock()) {
        if let Some(k) = kept
            .as_ref()
            .filter(|k| k.modules == modules && &k.bpf == ids)
        {
            return (Ok(k.kernel.clone()), true);
        }
    }
    let read = vmscope_symbols::Kallsyms::from_path(&proc_root.join("kallsyms"));
    if let (Ok(k), Some(ids), Ok(mut kept)) = (&read, bpf, KEPT.lock()) {
        if !k.is_restricted() && !k.is_empty() {
            *kept = Some(KeptKernel {
                modules,
                bpf: ids,
                kernel: k.clone(),
            });
        }
    }
    (read, false)
}

/// The slice of `snap` starting at `offset`, ending at a line end when the
/// rest does not fit in one message; the module list rides with offset 0.
pub fn slice(snap: &Snapshot, offset: u64) -> Response {
    let total = snap.text.len();
    let start = match usize::try_from(offset) {
        Ok(s) if s <= total && snap.text.is_char_boundary(s) => s,
        _ => {
            return Response::Error {
                kind: ErrorKind::BadRequest,
                message: format!(
                    "offset {offset} is not a slice start of the {total}-byte kallsyms snapshot"
                ),
            }
        }
    };
    let mut end = (start + KALLSYMS_CHUNK).min(total);
    if end < total {
        match snap.text[start..end].rfind('\n') {
            Some(i) => end = start + i + 1,
            None => {
                while !snap.text.is_char_boundary(end) {
                    end -= 1;
                }
            }
        }
    }
    Response::Kallsyms {
        offset,
        total: total as u64,
        text: snap.text[start..end].to_string(),
        modules: if start == 0 {
            snap.modules.clone()
        } else {
            Vec::new()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_reuses_the_kernel_table_while_modules_and_bpf_programs_stay() {
        if bpf_prog_ids().is_none() {
            vmscope_testkit::skip("the BPF syscall does not list programs here (not root?)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        std::fs::write(
            d.path().join("kallsyms"),
            "ffffffff81000000 T _stext\nffffffff81000100 T do_one\n",
        )
        .unwrap();
        std::fs::write(d.path().join("modules"), "virtio_net 1 0 - Live 0x0\n").unwrap();
        let (k, kept) = session_kernel(d.path());
        assert!(!kept);
        assert_eq!(
            k.unwrap().lookup(0xffffffff81000104).unwrap().name,
            "do_one"
        );
        // The file changes, the modules and programs do not: the kept
        // table answers (kallsyms is not read again).
        std::fs::write(d.path().join("kallsyms"), "ffffffff81000000 T _stext\n").unwrap();
        let (k, kept) = session_kernel(d.path());
        assert!(kept);
        assert_eq!(
            k.unwrap().lookup(0xffffffff81000104).unwrap().name,
            "do_one"
        );
        // A module loaded: read again.
        std::fs::write(
            d.path().join("modules"),
            "virtio_net 1 0 - Live 0x0\nxfs 1 0 - Live 0x0\n",
        )
        .unwrap();
        let (k, kept) = session_kernel(d.path());
        assert!(!kept);
        assert_eq!(
            k.unwrap().lookup(0xffffffff81000104).unwrap().name,
            "_stext"
        );
        // An unreadable kallsyms is said, never taken from the cache of
        // another reading.
        std::fs::write(d.path().join("modules"), "").unwrap();
        std::fs::remove_file(d.path().join("kallsyms")).unwrap();
        let (k, kept) = session_kernel(d.path());
        assert!(!kept && k.is_err());
    }

    #[test]
    fn slices_end_at_lines_and_cover_the_text() {
        let line = "ffffffff81000000 T some_function_name\n";
        let text = line.repeat(KALLSYMS_CHUNK / line.len() * 2 + 7);
        let snap = Snapshot {
            text: text.clone(),
            modules: vec!["m".into()],
        };
        let mut got = String::new();
        let mut n = 0;
        loop {
            let Response::Kallsyms {
                offset,
                total,
                text: t,
                modules,
            } = slice(&snap, got.len() as u64)
            else {
                panic!()
            };
            assert_eq!(offset as usize, got.len());
            assert_eq!(total as usize, text.len());
            assert_eq!(modules.is_empty(), offset != 0);
            assert!(t.ends_with('\n'));
            got.push_str(&t);
            n += 1;
            if got.len() == text.len() {
                break;
            }
        }
        assert_eq!(got, text);
        assert_eq!(n, 3);
        assert!(matches!(
            slice(&snap, text.len() as u64 + 1),
            Response::Error {
                kind: ErrorKind::BadRequest,
                ..
            }
        ));
    }

    #[test]
    fn reads_a_rooted_proc() {
        let d = std::env::temp_dir().join(format!("vmscope-agent-ksyms-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("kallsyms"), "ffffffff81000000 T _stext\n").unwrap();
        std::fs::write(
            d.join("modules"),
            "virtio_console 45056 1 - Live 0x0000000000000000\nfoo 1 0 - Live 0x0\n",
        )
        .unwrap();
        let s = read(&d).unwrap();
        assert_eq!(s.modules, ["virtio_console", "foo"]);
        std::fs::remove_file(d.join("modules")).unwrap();
        assert!(read(&d).unwrap().modules.is_empty());
        std::fs::remove_dir_all(&d).unwrap();
        assert!(read(&d).is_err());
    }
}
