//! Compiles the eBPF programs in `src/bpf/*.bpf.c` with clang
//! (`-target bpf`, BTF on, CO-RE relocations) into `OUT_DIR`, where
//! `src/object.rs` embeds them: the binary carries the objects and needs
//! no compiler where it runs. The headers are libbpf's own (from
//! libbpf-sys) and the system's uapi headers (linux-libc-dev).

use std::path::{Path, PathBuf};
use std::process::Command;

const PROGRAMS: &[&str] = &["sched"];

/// clang: `$CLANG`, else the first of `clang`, `clang-19` .. `clang-14`
/// that runs.
fn clang() -> String {
    if let Ok(c) = std::env::var("CLANG") {
        return c;
    }
    let mut names = vec!["clang".to_string()];
    names.extend((14..=19).rev().map(|v| format!("clang-{v}")));
    for n in names {
        if Command::new(&n)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return n;
        }
    }
    panic!(
        "vmscope-bpf: no clang found to build the eBPF programs (apt-get install clang; \
         scripts/setup.sh installs it), or set CLANG"
    );
}

fn main() {
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let include = std::env::var("DEP_BPF_INCLUDE").expect("libbpf-sys's headers (DEP_BPF_INCLUDE)");
    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".into());
    let target_arch = match arch.as_str() {
        "x86_64" => "x86",
        "aarch64" => "arm64",
        other => other,
    };
    // Debian keeps asm/ (which linux/types.h includes) under the
    // multiarch directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    let clang = clang();
    for p in PROGRAMS {
        let src = Path::new("src/bpf").join(format!("{p}.bpf.c"));
        println!("cargo:rerun-if-changed={}", src.display());
        let obj = out.join(format!("{p}.bpf.o"));
        let mut c = Command::new(&clang);
        c.args(["-target", "bpf", "-O2", "-g", "-Wall", "-Werror"])
            .arg(format!("-D__TARGET_ARCH_{target_arch}"))
            .arg(format!("-I{include}"));
        if Path::new(&multiarch).is_dir() {
            c.arg(format!("-I{multiarch}"));
        }
        let status = c
            .arg("-c")
            .arg(&src)
            .arg("-o")
            .arg(&obj)
            .status()
            .unwrap_or_else(|e| panic!("vmscope-bpf: running {clang}: {e}"));
        assert!(
            status.success(),
            "vmscope-bpf: {clang} failed to build {}",
            src.display()
        );
    }
}
