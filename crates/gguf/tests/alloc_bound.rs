//! Bounded memory: the reader must never allocate more than a small multiple of the input
//! size, whatever the input claims. Oracle: a counting global allocator measures the peak
//! heap growth of the parsing thread during `Gguf::from_bytes` (the input `Vec` is
//! allocated before measuring starts).
//!
//! The argument for the bound: every count is checked against `remaining / min_item_size`
//! before a collection is created, so each allocated item is backed by at least its minimal
//! encoding. Arrays are typed vectors, so an item costs about its encoded size; the worst
//! ratios are small structures (many tiny keys, arrays of empty arrays).
//!
//! The same counter guards resident memory: a tokenizer vocabulary (hundreds of thousands
//! of short strings) must cost about its encoded size, not an enum and an allocation per
//! token (that layout cost Gemma 3 ~30 MiB of heap for the life of the process).

mod common;

use common::{Raw, Rng, mutate, sample_bytes};
use ferrite_gguf::Gguf;
use ferrite_testkit::{CountingAlloc, measure};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Worst-case heap bytes per input byte, plus a constant for small fixed structures.
const MAX_RATIO: usize = 10;
const SLACK: usize = 64 * 1024;

/// Peak heap growth while parsing `bytes` (and dropping the result).
fn peak_growth(bytes: Vec<u8>) -> usize {
    measure(|| drop(Gguf::from_bytes(bytes))).1.peak_growth
}

fn assert_bounded(bytes: Vec<u8>, what: &str) -> usize {
    let len = bytes.len();
    let peak = peak_growth(bytes);
    assert!(
        peak <= MAX_RATIO * len + SLACK,
        "{what}: parsing {len} bytes allocated {peak} bytes"
    );
    peak
}

#[test]
fn parsing_allocates_at_most_a_small_multiple_of_the_input() {
    // Claims of 2^63 items in tiny files.
    assert_bounded(Raw::header(3, 0, 1 << 63).build(), "2^63 keys");
    assert_bounded(Raw::header(3, 1 << 63, 0).build(), "2^63 tensors");
    let mut r = Raw::header(3, 0, 1);
    r.str(b"a").u32(9).u32(8).u64(1 << 63);
    assert_bounded(r.build(), "2^63 strings");
    // A count 1000 times what the remaining bytes back: a relaxed check would allocate
    // about 2 GB of `Value`s here before failing on the missing items.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"a").u32(9).u32(10).u64(64_000_000).data(64_000);
    assert_bounded(r.build(), "1000x u64 array");

    // The worst legitimate ratio: a large u8 array.
    let n = 200_000;
    let mut r = Raw::header(3, 0, 1);
    r.str(b"a").u32(9).u32(0).u64(n).data(n as usize);
    let len = r.0.len();
    let peak = assert_bounded(r.build(), "u8 array");
    println!(
        "u8 array: {len} bytes -> peak {peak} bytes ({:.1}x)",
        peak as f64 / len as f64
    );

    // A vocabulary: 262,144 short strings, as Gemma 3 ships.
    let n = 262_144u64;
    let mut r = Raw::header(3, 0, 1);
    r.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(n);
    for i in 0..n {
        r.str(format!("t{i}").as_bytes());
    }
    let len = r.0.len();
    let peak = peak_growth(r.build());
    println!(
        "string array: {len} bytes -> peak {peak} bytes ({:.1}x)",
        peak as f64 / len as f64
    );
    assert!(
        peak <= 2 * len,
        "a vocabulary of {len} bytes took {peak} bytes of heap"
    );

    // Arrays of empty arrays: 12 encoded bytes per item.
    let n = 50_000u64;
    let mut r = Raw::header(3, 0, 1);
    r.str(b"a").u32(9).u32(9).u64(n);
    for _ in 0..n {
        r.u32(0).u64(0);
    }
    let len = r.0.len();
    let peak = assert_bounded(r.build(), "nested arrays");
    println!(
        "nested empty arrays: {len} bytes -> peak {peak} bytes ({:.1}x)",
        peak as f64 / len as f64
    );

    // Many tiny keys.
    let n = 20_000;
    let mut r = Raw::header(3, 0, n);
    for i in 0..n {
        r.str(format!("{i:x}").as_bytes()).u32(0).bytes(&[0]);
    }
    let len = r.0.len();
    let peak = assert_bounded(r.build(), "many keys");
    println!(
        "many keys: {len} bytes -> peak {peak} bytes ({:.1}x)",
        peak as f64 / len as f64
    );

    // Random mutants of the sample, many of which corrupt counts and lengths.
    let base = sample_bytes();
    let mut rng = Rng::new(0xA110C);
    let mut worst = 0usize;
    for _ in 0..2000 {
        let mut bytes = base.clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut bytes);
        }
        worst = worst.max(assert_bounded(bytes, "mutant"));
    }
    println!(
        "2000 mutants of a {}-byte file: worst peak {worst} bytes",
        base.len()
    );
}
