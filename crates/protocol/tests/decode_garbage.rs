//! Drives `fuzz_decode` (the body of the fuzz target) over 10,000 generated
//! inputs: random bytes, random bytes seeded with magics and valid headers,
//! and valid frame streams with bit flips, truncations and splices.

use vmscope_protocol::*;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn header(len: u32, body_crc: u32) -> Vec<u8> {
    let mut h = MAGIC.to_vec();
    h.extend_from_slice(&len.to_le_bytes());
    h.extend_from_slice(&[1, 0, 0, 0]);
    h.extend_from_slice(&body_crc.to_le_bytes());
    let c = crc32(&h);
    h.extend_from_slice(&c.to_le_bytes());
    h
}

fn samples() -> Vec<Vec<u8>> {
    let bodies: [&[u8]; 8] = [
        br#"{"v":1,"id":1,"type":"hello","nonce":5,"host_version":"x"}"#,
        br#"{"v":1,"id":2,"type":"exec","argv":["a"],"timeout_ms":9,"stdin":"AAAA"}"#,
        br#"{"v":1,"id":3,"type":"hello","protocol":1,"agent_version":"a","kernel":"k","hostname":"h","cpus":1,"mem_bytes":2}"#,
        br#"{"v":1,"id":4,"type":"exec_result","exit_code":0,"stdout":"","stderr":"","truncated":false}"#,
        br#"{"v":1,"id":5,"type":"put_file","path":"/p","mode":420,"offset":0,"data":"Zm9v","last":true}"#,
        br#"{"v":1,"id":6,"type":"error","kind":"denied","message":"no"}"#,
        br#"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["#,
        br#"{"v":1,"id":18446744073709551615,"type":"pong","seq":-1}"#,
    ];
    bodies.iter().map(|b| encode_frame(1, b).unwrap()).collect()
}

#[test]
fn ten_thousand_generated_inputs() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    let valid = samples();
    let mut total = 0usize;
    for i in 0..10_000 {
        let mut data = Vec::new();
        match i % 4 {
            0 => {
                let len = rng.below(2048);
                data.extend((0..len).map(|_| rng.next() as u8));
            }
            1 => {
                for _ in 0..rng.below(8) {
                    data.extend_from_slice(&MAGIC[..1 + rng.below(4)]);
                    if rng.below(2) == 0 {
                        let len = match rng.below(3) {
                            0 => rng.next() as u32,
                            1 => rng.below(64) as u32,
                            _ => MAX_FRAME as u32 + 1,
                        };
                        data.extend(header(len, rng.next() as u32));
                    }
                    let n = rng.below(80);
                    data.extend((0..n).map(|_| rng.next() as u8));
                }
            }
            2 => {
                for _ in 0..1 + rng.below(4) {
                    let mut f = valid[rng.below(valid.len())].clone();
                    for _ in 0..rng.below(3) {
                        let at = rng.below(f.len());
                        f[at] ^= 1 << rng.below(8);
                    }
                    if rng.below(3) == 0 {
                        f.truncate(rng.below(f.len()));
                    }
                    data.extend(f);
                }
            }
            _ => {
                // Valid headers around random bodies (checksums made to match).
                const ALPHA: &[u8] = b"{}[]\":,0123456789abcdefghijklmnopqrstuvwxyz \\";
                for _ in 0..1 + rng.below(3) {
                    let len = rng.below(200);
                    let body: Vec<u8> = (0..len).map(|_| ALPHA[rng.below(ALPHA.len())]).collect();
                    data.extend(encode_frame(1 + rng.below(2) as u8, &body).unwrap());
                }
            }
        }
        total += data.len();
        fuzz_decode(&data);
    }
    assert!(total > 1_000_000, "inputs too small: {total} bytes");
}
