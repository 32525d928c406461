//! libFuzzer-free smoke loop: runs each target body on its seed corpus and
//! then on deterministic mutations of it (bit flips, byte overwrites with
//! edge values, truncation, duplication, splicing). Works on stable Rust
//! without sanitizers; `SMOKE_RUNS` sets the number of mutated inputs per
//! target (default 20000).

use std::path::Path;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

fn seeds(target: &str) -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_file())
        .filter_map(|e| std::fs::read(e.path()).ok())
        .collect();
    out.push(Vec::new());
    out
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seeds[rng.below(seeds.len())].clone();
    for _ in 0..1 + rng.below(8) {
        let len = d.len();
        match rng.below(7) {
            0 if len > 0 => {
                let i = rng.below(len);
                d[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                d[i] = [0, 0xff, 0x7f, 0x80, b'\n', b' ', b'[', b']'][rng.below(8)];
            }
            2 if len > 0 => d.truncate(rng.below(len)),
            3 if len > 0 => {
                let i = rng.below(len);
                let j = (i + rng.below(64)).min(len);
                let chunk = d[i..j].to_vec();
                let at = rng.below(len + 1);
                d.splice(at..at, chunk);
            }
            4 => {
                let other = &seeds[rng.below(seeds.len())];
                if !other.is_empty() {
                    let i = rng.below(other.len());
                    let at = rng.below(len + 1);
                    d.truncate(at);
                    d.extend_from_slice(&other[i..]);
                }
            }
            5 if len >= 8 => {
                let i = rng.below(len - 7);
                let v = [0u64, u64::MAX, 1 << 63, 0x1000, 0xffff_ffff][rng.below(5)];
                d[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => {
                let at = rng.below(len + 1);
                d.insert(at, rng.next() as u8);
            }
        }
    }
    d
}

fn run(target: &str, body: fn(&[u8])) {
    let runs: usize = std::env::var("SMOKE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seeds = seeds(target);
    for s in &seeds {
        body(s);
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for _ in 0..runs {
        let input = mutate(&mut rng, &seeds);
        body(&input);
    }
    eprintln!(
        "{target}: {} seeds + {runs} mutated inputs, no panic",
        seeds.len()
    );
}

#[test]
fn kallsyms_smoke() {
    run("kallsyms", vmscope_fuzz::kallsyms);
}

#[test]
fn elf_smoke() {
    run("elf", vmscope_fuzz::elf);
}

#[test]
fn frames_smoke() {
    run("frames", vmscope_fuzz::frames);
}

#[test]
fn perfdata_smoke() {
    run("perfdata", vmscope_fuzz::perfdata);
}

#[test]
fn blocks_smoke() {
    run("blocks", vmscope_fuzz::blocks);
}
