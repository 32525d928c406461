//! Resolves per second of the symbolizer, cold (each frame's first
//! resolve, ELF parsed once) and hot (cached answers), on 2000 host kernel
//! symbols and 3000 file offsets of this executable. Run by
//! `bench/symbols-throughput`; `tests/live.rs` checks that the cached
//! answers equal the first ones.
//!
//! usage: resolve_throughput [HOT_RESOLVES=2000000]

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;
use vmscope_model::{ImageRef, NormalizedFrame};
use vmscope_symbols::{Symbolizer, SymbolizerOptions};

fn main() {
    let hot_n: usize = std::env::args()
        .nth(1)
        .map_or(2_000_000, |a| a.parse().expect("HOT_RESOLVES: a count"));
    let exe = std::env::current_exe().expect("own executable");
    let path: Arc<str> = exe.to_string_lossy().into();
    let t = Instant::now();
    let mut sym = Symbolizer::new(SymbolizerOptions::default());
    let new_ms = t.elapsed().as_secs_f64() * 1e3;
    let kernel = sym.kernel().iter().map(|s| s.start).take(2000);
    let frames: Vec<NormalizedFrame> = kernel
        .map(|a| NormalizedFrame {
            image: ImageRef::Kernel,
            addr: a + 3,
        })
        .chain((0..3000u64).map(|i| NormalizedFrame {
            image: ImageRef::File {
                path: path.clone(),
                build_id: None,
            },
            addr: 0x1000 + i * 97,
        }))
        .collect();
    let t = Instant::now();
    for f in &frames {
        black_box(sym.resolve("host", f));
    }
    let cold = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for i in 0..hot_n {
        black_box(sym.resolve("host", &frames[(i * 7919) % frames.len()]));
    }
    let hot = t.elapsed().as_secs_f64();
    println!(
        "Symbolizer::new ({} kernel text symbols): {new_ms:.1} ms",
        sym.kernel().len()
    );
    println!(
        "cold: {} distinct frames in {:.1} ms = {:.0} resolves/s",
        frames.len(),
        cold * 1e3,
        frames.len() as f64 / cold
    );
    println!(
        "hot: {hot_n} cached resolves in {:.1} ms = {:.0} resolves/s",
        hot * 1e3,
        hot_n as f64 / hot
    );
}
