//! Writes the generated seed files of the `frames` and `perfdata` targets
//! into `corpus/` (run from anywhere: `cargo run --example make-seeds`).
//! The output is deterministic, so re-running it changes nothing unless the
//! writers changed.
//!
//! - `corpus/frames/*.frame`: frames built by the protocol encoders (a
//!   request, responses, and a stream of several frames back to back).
//! - `corpus/perfdata/tiny.perf.data` and `tiny-piped.perf.data`: small
//!   valid files (comm, mmap, samples with call chains including kernel and
//!   guest frames, a lost record) from the perfdata crate's test writer.
//! - `corpus/perfdata/quipper-head.perf.data`: the first 4 KiB of
//!   `testdata/perf/quipper.perf.data.callgraph-3.8` (a real perf 3.8 file).

use std::path::{Path, PathBuf};
use vmscope_model::CpuMode;
use vmscope_perfdata::testutil::{MmapSpec, PerfDataBuilder, SampleSpec};
use vmscope_protocol::{encode_request, encode_response, Request, Response};

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    println!("{} ({} bytes)", path.display(), bytes.len());
}

fn frames(dir: &Path) {
    let hello = encode_request(
        1,
        &Request::Hello {
            nonce: 0x0123_4567_89ab_cdef,
            host_version: "0.1.0".to_string(),
        },
    )
    .expect("hello");
    let ping = encode_request(2, &Request::Ping { seq: 7 }).expect("ping");
    let pong = encode_response(2, &Response::Pong { seq: 7 }).expect("pong");
    write(dir, "hello-request.frame", &hello);
    write(dir, "ping-request.frame", &ping);
    write(dir, "pong-response.frame", &pong);
    let stream: Vec<u8> = [&hello[..], &ping[..], &pong[..]].concat();
    write(dir, "stream.frame", &stream);
}

fn perfdata(dir: &Path, root: &Path) {
    let pid = 42;
    let user = |ip: u64, callchain: Vec<u64>, time: u64| SampleSpec {
        pid,
        tid: pid + 1,
        cpu: 1,
        time,
        ip,
        callchain,
        ..SampleSpec::default()
    };
    let b = PerfDataBuilder::new()
        .hostname("fuzz-seed")
        .comm(pid, pid, "qemu")
        .mmap(MmapSpec::file(pid, 0x40_0000, 0x10_000, 0, "/usr/bin/qemu"))
        .mmap(MmapSpec {
            mmap2: true,
            build_id: Some(vec![0xab; 20]),
            ..MmapSpec::file(pid, 0x7f00_0000_0000, 0x20_0000, 0x1000, "/lib/libc.so.6")
        })
        .sample(user(0x40_1234, vec![], 10))
        .sample(user(
            0x7f00_0000_2000,
            // PERF_CONTEXT_USER, leaf, caller.
            vec![0xffff_ffff_ffff_fe00, 0x7f00_0000_2000, 0x40_1000],
            20,
        ))
        .sample(SampleSpec {
            ip: 0xffff_ffff_8100_0000,
            mode: CpuMode::Kernel,
            // PERF_CONTEXT_KERNEL, kernel frames, PERF_CONTEXT_USER, user frame.
            callchain: vec![
                0xffff_ffff_ffff_ff80,
                0xffff_ffff_8100_0000,
                0xffff_ffff_8100_0100,
                0xffff_ffff_ffff_fe00,
                0x40_1000,
            ],
            ..user(0, vec![], 30)
        })
        .sample(SampleSpec {
            ip: 0xffff_ffff_8200_0000,
            mode: CpuMode::GuestKernel,
            ..user(0, vec![], 40)
        })
        .lost(3)
        .fork(pid, 1, pid + 2, pid)
        .exit(pid, pid + 2);
    write(dir, "tiny.perf.data", &b.to_bytes());
    write(dir, "tiny-piped.perf.data", &b.to_pipe_bytes());

    let quipper = root.join("testdata/perf/quipper.perf.data.callgraph-3.8");
    let bytes = std::fs::read(&quipper).unwrap_or_else(|e| panic!("{}: {e}", quipper.display()));
    write(
        dir,
        "quipper-head.perf.data",
        &bytes[..bytes.len().min(4096)],
    );
}

/// A deferring recording's blocks as the store writes them, each behind
/// the byte that picks its kind (0 rows, 1 stacks, 2 frames).
fn blocks(dir: &Path) {
    use vmscope_model::deferred::blocks as b;
    use vmscope_model::{Context, RawFrame, RawRowKey};
    let rows: Vec<(RawRowKey, u64, u64)> = (0..20u32)
        .map(|i| {
            (
                RawRowKey {
                    second: i / 4,
                    cpu: if i == 3 { u32::MAX } else { i % 2 },
                    event: 0,
                    context: Context::ALL[i as usize % Context::ALL.len()],
                    domain: i % 3,
                    process: i,
                    leaf: 1000 + i * 77,
                    stack: i % 5,
                },
                u64::from(i) + 1,
                250_000 * (u64::from(i) + 1),
            )
        })
        .collect();
    let stacks: Vec<(u32, Vec<u32>)> = (1..10u32)
        .map(|i| (i, (0..i * 3).map(|f| f * 131 + i).collect()))
        .collect();
    let frames = vec![
        (
            0,
            RawFrame::Kernel {
                addr: 0xffff_ffff_8100_0010,
                module: None,
            },
        ),
        (
            1,
            RawFrame::Kernel {
                addr: 0xffff_ffff_c000_1000,
                module: Some(4),
            },
        ),
        (
            2,
            RawFrame::File {
                path: 5,
                build_id: Some(6),
                offset: 0x1234,
            },
        ),
        (
            3,
            RawFrame::File {
                path: 5,
                build_id: None,
                offset: 0x10_0000,
            },
        ),
        (
            4,
            RawFrame::Named {
                image: 7,
                symbol: 8,
            },
        ),
    ];
    let with_kind = |k: u8, block: Vec<u8>| [vec![k], block].concat();
    write(dir, "rows.block", &with_kind(0, b::encode_rows(&rows)));
    write(
        dir,
        "stacks.block",
        &with_kind(
            1,
            b::encode_stacks(stacks.iter().map(|(i, f)| (*i, f.as_slice()))),
        ),
    );
    write(
        dir,
        "frames.block",
        &with_kind(2, b::encode_frames(&frames)),
    );
}

fn main() {
    let fuzz = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = fuzz.parent().expect("fuzz/ is inside the repository");
    for t in ["frames", "perfdata", "blocks"] {
        std::fs::create_dir_all(fuzz.join("corpus").join(t)).expect("corpus dir");
    }
    frames(&fuzz.join("corpus/frames"));
    perfdata(&fuzz.join("corpus/perfdata"), root);
    blocks(&fuzz.join("corpus/blocks"));
}
