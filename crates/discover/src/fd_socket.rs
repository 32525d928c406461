//! Following a socket QEMU inherited as a descriptor (`-chardev
//! socket,fd=N`, how libvirt passes the monitor and every channel) back to
//! the path it is bound to: `<proc>/PID/fd/N` → `socket:[INODE]` → the
//! kernel's unix socket table, `<proc>/PID/net/unix` (QEMU's network
//! namespace) and then `<proc>/net/unix` (ours). Reads through a
//! [`ProcRoot`], so tests run on fixture trees. When no path is found the
//! error says which step failed, in words `record` prints as the VM's
//! fallback reason.

use std::path::PathBuf;
use vmscope_linux::procfs::{parse_net_unix, socket_inode, ProcRoot};

/// The bound path of the socket `pid` holds as descriptor `fd`, or why
/// there is none, as a phrase that follows "inherited" ("descriptor 28,
/// which is not a socket (...)").
pub(crate) fn bound_path(proc: &ProcRoot, pid: u32, fd: u32) -> Result<PathBuf, String> {
    let link = proc.pid_path(pid, &format!("fd/{fd}"));
    let target = proc
        .fd_target(pid, fd)
        .map_err(|e| format!("descriptor {fd}, which cannot be read ({e})"))?;
    let inode = socket_inode(&target).ok_or_else(|| {
        format!(
            "descriptor {fd}, which is not a socket ({} → {})",
            link.display(),
            target.display()
        )
    })?;
    let own = proc.pid_path(pid, "net/unix");
    let global = proc.root().join("net/unix");
    let mut looked = Vec::new();
    for table in [&own, &global] {
        match std::fs::read_to_string(table) {
            Ok(s) => {
                if let Some(p) = parse_net_unix(&s).remove(&inode) {
                    return Ok(p);
                }
                looked.push(table.display().to_string());
            }
            Err(e) => looked.push(format!("{} (unreadable: {e})", table.display())),
        }
    }
    Err(format!(
        "descriptor {fd}, socket inode {inode}, which is bound to no path in {} (an unnamed or abstract socket has no path to connect to)",
        looked.join(" or ")
    ))
}
