//! Seeded mutation test: thousands of corrupted variants of a valid file must each either
//! parse or return an error — never panic — and never make the parser allocate more than a
//! small multiple of the input. Oracle for the allocation bound: a counting global allocator
//! measures peak heap growth during `SafeTensors::from_bytes` (the input is allocated first).

mod common;

use common::{Rng, sample};
use ferrite_safetensors::SafeTensors;
use ferrite_testkit::{CountingAlloc, measure};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Heap bytes per input byte (JSON values and per-tensor records), plus fixed slack.
const MAX_RATIO: usize = 64;
const SLACK: usize = 64 * 1024;

fn peak_growth(bytes: Vec<u8>) -> (usize, bool) {
    let (ok, stats) = measure(|| SafeTensors::from_bytes("m", bytes).is_ok());
    (stats.peak_growth, ok)
}

fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    match rng.below(5) {
        0 => {
            let i = rng.below(bytes.len());
            bytes[i] ^= 1 << rng.below(8);
        }
        1 => {
            let i = rng.below(bytes.len());
            bytes[i] = b"0123456789{}[]\",:-eE"[rng.below(20)];
        }
        2 => bytes.truncate(rng.below(bytes.len() + 1)),
        3 => {
            // Rewrite the length field with an arbitrary claim.
            let claim = match rng.below(3) {
                0 => rng.next(),
                1 => rng.next() % 4096,
                _ => u64::MAX - rng.next() % 16,
            };
            if bytes.len() >= 8 {
                bytes[..8].copy_from_slice(&claim.to_le_bytes());
            }
        }
        _ => {
            let i = rng.below(bytes.len());
            let extra: Vec<u8> = (0..rng.below(16)).map(|_| rng.next() as u8).collect();
            bytes.splice(i..i, extra);
        }
    }
}

#[test]
fn mutated_files_never_panic_or_over_allocate() {
    let mut rng = Rng(0x5eed_cafe_f00d_0001);
    let base = sample();
    let (mut parsed, mut rejected) = (0, 0);
    for _ in 0..20_000 {
        let mut bytes = base.clone();
        for _ in 0..1 + rng.below(3) {
            if bytes.is_empty() {
                break;
            }
            mutate(&mut rng, &mut bytes);
        }
        let len = bytes.len();
        let (peak, ok) = peak_growth(bytes);
        assert!(
            peak <= len * MAX_RATIO + SLACK,
            "parsing {len} bytes allocated {peak}"
        );
        if ok { parsed += 1 } else { rejected += 1 }
    }
    // Both outcomes must occur, or the mutator is not exercising the checks.
    assert!(
        parsed > 100 && rejected > 10_000,
        "parsed {parsed}, rejected {rejected}"
    );
}

#[test]
fn mutation_checker_fails_on_a_known_over_allocation() {
    // Test the test: an allocation far beyond the bound is seen by the counter.
    let ((), stats) = measure(|| drop(vec![0u8; 10 * 1024 * 1024]));
    assert!(stats.peak_growth > 1000 * MAX_RATIO + SLACK);
}
