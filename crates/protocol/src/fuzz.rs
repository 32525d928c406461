//! Entry point for fuzzers: drives both decoders over arbitrary bytes,
//! split into pushes whose sizes come from the input itself.

use crate::message::Decoder;

/// Feeds `data` to a request decoder and a response decoder and drains them.
/// Must never panic, loop forever or hold more bytes than it was given.
pub fn fuzz_decode(data: &[u8]) {
    let mut requests = Decoder::new();
    let mut responses = Decoder::new();
    let mut rest = data;
    let mut given = 0usize;
    while !rest.is_empty() {
        // Chunk sizes 1..=256 chosen by the first byte of what remains.
        let n = (usize::from(rest[0]) + 1).min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        rest = tail;
        given += n;
        requests.push(chunk);
        responses.push(chunk);
        while !matches!(requests.next_request(), Ok(None)) {}
        while !matches!(responses.next_response(), Ok(None)) {}
        assert!(requests.buffered() <= given);
        assert!(responses.buffered() <= given);
    }
    // The whole input at once must be handled as well.
    let mut whole = Decoder::new();
    whole.push(data);
    while !matches!(whole.next_request(), Ok(None)) {}
}
