//! The lab's guest image: the Debian cloud kernel (fetched with
//! `apt-get download`, unpacked with `dpkg-deb -x`) and a busybox-static
//! initramfs whose `/init` loads the virtio modules, mounts proc, sys,
//! devtmpfs, tracefs and debugfs, configures NICs from kernel command-line
//! variables and starts the statically linked guest agent. Images are cached
//! under `<cache>/images/<sha256 of the inputs>`; builds take a file lock so
//! concurrent builders (parallel tests) build once.

use crate::cancel::Cancel;
use crate::cpio::Cpio;
use crate::error::{LabError, Result};
use crate::spec::FileSpec;
use crate::util::{self, Sha256};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Bump when the layout or `/init` changes in a way the hash does not see.
const IMAGE_FORMAT: &str = "vmscope-lab-image-3";

/// The Debian metapackage whose dependency names the newest cloud kernel.
pub const KERNEL_METAPACKAGE: &str = "linux-image-cloud-amd64";

/// Command that builds the static guest agent.
pub const AGENT_BUILD: &str = "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS=\"-C target-feature=+crt-static -C force-frame-pointers=yes\" cargo build --release -p vmscope-agent --target x86_64-unknown-linux-gnu";

/// Where the Debian package installs the static agent on the host.
pub const PACKAGED_AGENT_PATH: &str = "/usr/lib/vmscope/vmscope-agent";

/// Where the agent lives in the guest.
pub const GUEST_AGENT_PATH: &str = "/usr/bin/vmscope-agent";

/// Line `/init` prints on the console once the guest is set up.
pub const READY_MARKER: &str = "vmscope-init: ready";

/// A built (or cached) guest image.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GuestImage {
    pub dir: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    pub kernel_package: String,
    pub kernel_release: String,
    pub hash: String,
    /// Modules in load order.
    pub modules: Vec<String>,
    /// The agent binary that was packed in.
    pub agent: PathBuf,
    pub initrd_bytes: u64,
}

/// Find the guest agent binary: `explicit`, then `$VMSCOPE_AGENT`, then next
/// to the current executable, then the workspace's static build output, then
/// the package's copy ([`PACKAGED_AGENT_PATH`]).
///
/// An `explicit` path is the only one: one that is missing or not a static
/// binary is refused, never replaced by another found elsewhere (`lab up
/// --agent /nonexistent` once booted with the workspace's agent).
pub fn find_agent(explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        if p.is_file() && is_static_elf(p) {
            return Ok(p.to_path_buf());
        }
        let why = if !p.exists() {
            "no such file"
        } else if !p.is_file() {
            "not a regular file"
        } else {
            "not a statically linked executable (the guest has no libraries)"
        };
        return Err(LabError::Image(format!(
            "--agent {}: {why}; build the agent with: {AGENT_BUILD}",
            p.display()
        )));
    }
    let mut looked = Vec::new();
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("VMSCOPE_AGENT") {
        candidates.push(PathBuf::from(p));
    }
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent() {
            candidates.push(dir.join("vmscope-agent"));
            // Test binaries live in target/<profile>/deps.
            if let Some(up) = dir.parent() {
                candidates.push(up.join("vmscope-agent"));
            }
        }
    }
    for base in target_dirs() {
        candidates.push(base.join("x86_64-unknown-linux-gnu/release/vmscope-agent"));
    }
    candidates.push(PathBuf::from(PACKAGED_AGENT_PATH));
    for c in candidates {
        if c.is_file() && is_static_elf(&c) {
            return Ok(c);
        }
        looked.push(if c.is_file() {
            format!("{} (not statically linked)", c.display())
        } else {
            c.display().to_string()
        });
    }
    Err(LabError::AgentBinary {
        looked: looked.join(", "),
        build: AGENT_BUILD.to_string(),
    })
}

/// Candidate cargo target directories: `$CARGO_TARGET_DIR`, and `target/`
/// in the current directory and above the current executable.
fn target_dirs() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        out.push(PathBuf::from(t));
    }
    if let Ok(exe) = std::env::current_exe() {
        for a in exe.ancestors() {
            if a.file_name().is_some_and(|n| n == "target") {
                out.push(a.to_path_buf());
                break;
            }
        }
    }
    if let Ok(cwd) = std::env::current_dir() {
        for a in cwd.ancestors() {
            let t = a.join("target");
            if t.is_dir() {
                out.push(t);
                break;
            }
        }
    }
    out
}

/// Whether an ELF file has no program interpreter (statically linked).
pub fn is_static_elf(path: &Path) -> bool {
    use object::Object;
    let Ok(data) = std::fs::read(path) else {
        return false;
    };
    let Ok(file) = object::File::parse(&*data) else {
        return false;
    };
    file.section_by_name(".interp").is_none()
}

/// The guest's `/init`.
pub fn init_script() -> String {
    format!(
        r#"#!/bin/busybox sh
# vmscope lab guest init. Kernel command-line variables arrive as env vars:
#   vmscope_name=NAME, vmscope_netN=user|A.B.C.D/LEN, vmscope_gw=A.B.C.D,
#   vmscope_agent=0|1, vmscope_root=/dev/vdX (switch_root to a disk)
/bin/busybox --install -s
export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm /tmp /run
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
for m in $(cat /lib/modules/vmscope/order 2>/dev/null); do
  insmod /lib/modules/vmscope/$m.ko 2>/dev/null || echo "vmscope-init: insmod $m failed (built in?)"
done
hostname "${{vmscope_name:-guest}}"
echo "${{vmscope_name:-guest}}" > /etc/hostname
ip link set lo up
i=0
while [ $i -lt 8 ]; do
  eval cfg=\$vmscope_net$i
  if [ -n "$cfg" ]; then
    ip link set eth$i up
    if [ "$cfg" = user ]; then
      ip addr add 10.0.2.15/24 dev eth$i
      ip route add default via 10.0.2.2 dev eth$i
      echo "nameserver 10.0.2.3" > /etc/resolv.conf
    else
      ip addr add "$cfg" dev eth$i
    fi
  fi
  i=$((i+1))
done
if [ -n "$vmscope_gw" ]; then ip route add default via "$vmscope_gw" 2>/dev/null; fi
if [ -n "$vmscope_root" ]; then
  mkdir -p /newroot
  if mount "$vmscope_root" /newroot; then
    echo "vmscope-init: switching root to $vmscope_root"
    exec switch_root /newroot /sbin/init
  fi
  echo "vmscope-init: cannot mount $vmscope_root, staying in the initramfs"
fi
if [ "$vmscope_agent" != 0 ] && [ -x {agent} ]; then
  ( while true; do
      {agent} --name {port} --allow-exec
      echo "vmscope-init: agent exited ($?), restarting"
      sleep 1
    done ) </dev/null >/dev/console 2>&1 &
fi
echo "{ready} (kernel $(uname -r))"
while true; do
  setsid cttyhack sh
  sleep 1
done
"#,
        agent = GUEST_AGENT_PATH,
        port = vmscope_protocol::AGENT_PORT,
        ready = READY_MARKER,
    )
}

/// A cpio overlay holding extra files (appended to the base initramfs).
pub fn overlay(files: &[FileSpec]) -> Result<Vec<u8>> {
    use std::os::unix::fs::PermissionsExt;
    let mut c = Cpio::new();
    for f in files {
        let data = std::fs::read(&f.host)
            .map_err(|e| LabError::io("read file for the guest", &f.host, e))?;
        let mode = std::fs::metadata(&f.host)
            .map(|m| m.permissions().mode())
            .unwrap_or(0o644);
        c.parents(&f.guest);
        c.file(&f.guest, mode, data);
    }
    Ok(c.to_bytes())
}

/// Cache directory: explicit, else `$VMSCOPE_CACHE`, else /var/cache/vmscope.
pub fn default_cache_dir() -> PathBuf {
    std::env::var_os("VMSCOPE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/vmscope"))
}

/// An unpacked kernel package.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub package: String,
    pub release: String,
    pub vmlinuz: PathBuf,
    pub modules_dir: PathBuf,
}

/// The kernel package to use: the metapackage's `linux-image-*` dependency.
fn newest_kernel_package() -> Result<String> {
    let apt_cache = util::require_tool("apt-cache", "apt")?;
    let out = util::run(
        "finding the guest kernel package",
        Command::new(apt_cache).args(["depends", KERNEL_METAPACKAGE]),
    )?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p.ends_with("-cloud-amd64"))
        .map(str::to_string)
        .ok_or_else(|| {
            LabError::Image(format!(
                "apt-cache depends {KERNEL_METAPACKAGE} names no linux-image-*-cloud-amd64 (run apt-get update)"
            ))
        })
}

/// Fetch (once) and unpack the Debian cloud kernel into `<cache>/kernels/`.
pub fn fetch_kernel(cache: &Path, package: Option<&str>) -> Result<Kernel> {
    fetch_kernel_cancellable(cache, package, &Cancel::new())
}

/// [`fetch_kernel`] that stops (killing apt-get or dpkg-deb) when `cancel` is set.
pub fn fetch_kernel_cancellable(
    cache: &Path,
    package: Option<&str>,
    cancel: &Cancel,
) -> Result<Kernel> {
    let kdir = cache.join("kernels");
    std::fs::create_dir_all(&kdir).map_err(|e| LabError::io("create", &kdir, e))?;
    let _lock = util::lock_file_cancellable(
        &kdir.join(".lock"),
        cancel,
        "waiting for another process fetching the guest kernel",
    )?;
    let package = match package {
        Some(p) => p.to_string(),
        None => match newest_kernel_package() {
            Ok(p) => p,
            Err(e) => {
                // Offline: use the newest kernel already unpacked.
                let mut have: Vec<String> = std::fs::read_dir(&kdir)
                    .map(|rd| {
                        rd.flatten()
                            .filter(|d| d.path().join("root").is_dir())
                            .map(|d| d.file_name().to_string_lossy().into_owned())
                            .collect()
                    })
                    .unwrap_or_default();
                have.sort();
                have.pop().ok_or(e)?
            }
        },
    };
    let pdir = kdir.join(&package);
    let root = pdir.join("root");
    if !root.is_dir() {
        let dl = pdir.join("download");
        let _ = std::fs::remove_dir_all(&dl);
        std::fs::create_dir_all(&dl).map_err(|e| LabError::io("create", &dl, e))?;
        let apt_get = util::require_tool("apt-get", "apt")?;
        util::run_cancellable(
            &format!("downloading guest kernel {package}"),
            Command::new(apt_get)
                .current_dir(&dl)
                .args(["download", &package]),
            cancel,
        )?;
        let deb = std::fs::read_dir(&dl)
            .map_err(|e| LabError::io("read", &dl, e))?
            .flatten()
            .map(|e| e.path())
            .find(|p| p.extension().is_some_and(|x| x == "deb"))
            .ok_or_else(|| {
                LabError::Image(format!(
                    "apt-get download {package} left no .deb in {}",
                    dl.display()
                ))
            })?;
        let dpkg_deb = util::require_tool("dpkg-deb", "dpkg")?;
        let tmp = pdir.join("root.tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        util::run_cancellable(
            &format!("unpacking {}", deb.display()),
            Command::new(dpkg_deb).arg("-x").arg(&deb).arg(&tmp),
            cancel,
        )?;
        std::fs::rename(&tmp, &root).map_err(|e| LabError::io("rename", &tmp, e))?;
        let _ = std::fs::remove_dir_all(&dl);
    }
    let boot = root.join("boot");
    let vmlinuz = std::fs::read_dir(&boot)
        .map_err(|e| LabError::io("read", &boot, e))?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
        })
        .ok_or_else(|| LabError::Image(format!("no vmlinuz-* in {}", boot.display())))?;
    let release = vmlinuz
        .file_name()
        .map(|n| {
            n.to_string_lossy()
                .trim_start_matches("vmlinuz-")
                .to_string()
        })
        .unwrap_or_default();
    let modules_dir = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m).join(&release))
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            LabError::Image(format!("no lib/modules/{release} in {}", root.display()))
        })?;
    Ok(Kernel {
        package,
        release,
        vmlinuz,
        modules_dir,
    })
}

/// Inputs of an image build.
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    pub cache_dir: PathBuf,
    pub agent: Option<PathBuf>,
    pub kernel_package: Option<String>,
    /// Stops a build under way (downloads and waits for other builders).
    pub cancel: Cancel,
}

/// Build the guest image, or return the cached one with the same inputs.
pub fn build_image(opts: &ImageOptions) -> Result<GuestImage> {
    let agent = find_agent(opts.agent.as_deref())?;
    let busybox = util::require_tool("busybox", "busybox-static")?;
    if !is_static_elf(&busybox) {
        return Err(LabError::Image(format!(
            "{} is not statically linked: install the Debian package 'busybox-static'",
            busybox.display()
        )));
    }
    let kernel = fetch_kernel_cancellable(
        &opts.cache_dir,
        opts.kernel_package.as_deref(),
        &opts.cancel,
    )?;
    opts.cancel.check("building the guest image")?;
    let modules = crate::modules::resolve(&kernel.modules_dir)?;
    let init = init_script();

    // Fast path: the same input files (path, size, mtime, inode) as a
    // cached image skip reading and hashing them again.
    let images = opts.cache_dir.join("images");
    let mut inputs: Vec<&Path> = vec![&kernel.vmlinuz, &busybox, &agent];
    inputs.extend(modules.iter().map(|m| m.1.as_path()));
    let stamp = input_stamp(&init, &inputs);
    let stamp_file = images.join("stamps").join(&stamp);
    if let Some(img) = std::fs::read_to_string(&stamp_file)
        .ok()
        .and_then(|dir| load_manifest(&images.join(dir.trim())))
    {
        return Ok(img);
    }

    // Content hash of every input.
    let mut h = Sha256::new();
    h.field(IMAGE_FORMAT.as_bytes());
    h.field(init.as_bytes());
    let read = |p: &Path| std::fs::read(p).map_err(|e| LabError::io("read", p, e));
    let vmlinuz = read(&kernel.vmlinuz)?;
    h.field(&vmlinuz);
    let mut kos = Vec::new();
    for (name, path) in &modules {
        let data = read(path)?;
        h.field(name.as_bytes());
        h.field(&data);
        kos.push((name.clone(), data));
    }
    let busybox_bytes = read(&busybox)?;
    h.field(&busybox_bytes);
    let agent_bytes = read(&agent)?;
    h.field(&agent_bytes);
    let hash = h.hex();

    let dir = images.join(&hash[..16]);
    opts.cancel.check("building the guest image")?;
    let _lock = util::lock_file_cancellable(
        &images.join(".lock"),
        &opts.cancel,
        "waiting for another process building the guest image",
    )?;
    let short = hash[..16].to_string();
    let write_stamp = || {
        let _ = std::fs::create_dir_all(images.join("stamps"));
        let _ = util::write_atomic(&stamp_file, short.as_bytes());
    };
    if let Some(img) = load_manifest(&dir).filter(|i| i.hash == hash) {
        write_stamp();
        return Ok(img);
    }
    remove_stale_builds(&images);
    let tmp = images.join(format!("{}.tmp{}", &hash[..16], std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| LabError::io("create", &tmp, e))?;

    let mut c = Cpio::new();
    for d in [
        "bin",
        "sbin",
        "usr",
        "usr/bin",
        "usr/sbin",
        "usr/local",
        "usr/local/bin",
        "etc",
        "proc",
        "sys",
        "dev",
        "tmp",
        "run",
        "root",
        "lib",
        "lib/modules",
        "lib/modules/vmscope",
        "mnt",
        "var",
        "var/tmp",
    ] {
        c.dir(d, 0o755);
    }
    c.char_dev("dev/console", 0o600, 5, 1);
    c.char_dev("dev/null", 0o666, 1, 3);
    c.file("bin/busybox", 0o755, busybox_bytes);
    c.symlink("bin/sh", "busybox");
    c.file("init", 0o755, init.into_bytes());
    c.file(GUEST_AGENT_PATH, 0o755, agent_bytes);
    let mut order = String::new();
    for (name, data) in kos {
        c.file(&format!("lib/modules/vmscope/{name}.ko"), 0o644, data);
        order.push_str(&name);
        order.push('\n');
    }
    c.file("lib/modules/vmscope/order", 0o644, order.into_bytes());
    c.file(
        "etc/passwd",
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\n".to_vec(),
    );
    c.file("etc/group", 0o644, b"root:x:0:\n".to_vec());
    let cpio = c.to_bytes();
    let initrd_bytes = cpio.len() as u64;
    std::fs::write(tmp.join("initrd.cpio"), cpio)
        .map_err(|e| LabError::io("write", tmp.join("initrd.cpio"), e))?;
    std::fs::write(tmp.join("vmlinuz"), vmlinuz)
        .map_err(|e| LabError::io("write", tmp.join("vmlinuz"), e))?;
    let img = GuestImage {
        kernel: dir.join("vmlinuz"),
        initrd: dir.join("initrd.cpio"),
        dir: dir.clone(),
        kernel_package: kernel.package,
        kernel_release: kernel.release,
        hash,
        modules: modules.into_iter().map(|m| m.0).collect(),
        agent,
        initrd_bytes,
    };
    let json = serde_json::to_vec_pretty(&img).map_err(|e| LabError::Image(e.to_string()))?;
    std::fs::write(tmp.join("image.json"), json)
        .map_err(|e| LabError::io("write", tmp.join("image.json"), e))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir).map_err(|e| LabError::io("rename", &tmp, e))?;
    write_stamp();
    Ok(img)
}

/// Remove half-built image directories (`<hash>.tmp<pid>`) of builders that
/// died; called with the images lock held.
fn remove_stale_builds(images: &Path) {
    let Ok(rd) = std::fs::read_dir(images) else {
        return;
    };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some((_, pid)) = name.split_once(".tmp") else {
            continue;
        };
        if pid.parse::<u32>().is_ok_and(|p| !crate::state::alive(p)) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A cached image's manifest, if the image is complete.
fn load_manifest(dir: &Path) -> Option<GuestImage> {
    let text = std::fs::read_to_string(dir.join("image.json")).ok()?;
    let img: GuestImage = serde_json::from_str(&text).ok()?;
    (img.kernel.is_file() && img.initrd.is_file()).then_some(img)
}

/// Hash of the build recipe and the identity (not content) of input files.
fn input_stamp(init: &str, inputs: &[&Path]) -> String {
    use std::os::unix::fs::MetadataExt;
    let mut h = Sha256::new();
    h.field(IMAGE_FORMAT.as_bytes());
    h.field(init.as_bytes());
    for p in inputs {
        h.field(p.as_os_str().as_encoded_bytes());
        if let Ok(m) = std::fs::metadata(p) {
            for v in [m.len(), m.ino(), m.mtime() as u64, m.mtime_nsec() as u64] {
                h.update(&v.to_le_bytes());
            }
        }
    }
    h.hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn init_script_mentions_everything() {
        let s = init_script();
        for needle in [
            "mount -t proc",
            "mount -t devtmpfs",
            "mount -t tracefs",
            "mount -t debugfs",
            "insmod",
            "10.0.2.15/24",
            "--name vmscope.agent --allow-exec",
            READY_MARKER,
        ] {
            assert!(s.contains(needle), "missing {needle}");
        }
        assert!(s.starts_with("#!/bin/busybox sh\n"));
    }

    #[test]
    fn overlay_holds_files_with_parents() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("x");
        std::fs::write(&f, b"payload").unwrap();
        let bytes = overlay(&[FileSpec {
            host: f,
            guest: "/opt/t/x".into(),
        }])
        .unwrap();
        let s = String::from_utf8_lossy(&bytes);
        assert!(s.contains("opt/t/x"));
        assert!(s.contains("payload"));
    }

    #[test]
    fn missing_agent_says_how_to_build() {
        let e = find_agent(Some(Path::new("/nonexistent/agent")));
        if let Err(e) = e {
            let m = e.to_string();
            assert!(m.contains("/nonexistent/agent"), "{m}");
            assert!(m.contains("cargo build --release -p vmscope-agent"), "{m}");
        }
    }
}
