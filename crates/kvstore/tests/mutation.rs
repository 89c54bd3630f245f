//! Seeded mutation test over snapshot files: random byte flips, truncations and header
//! fields rewritten with a valid header checksum (so the length checks, not the checksum,
//! have to catch them). Oracle: decoding never panics, never accepts a changed file, and
//! never allocates more than the file's own size (a counting global allocator measures the
//! largest single allocation).

use ferrite_kvstore::{
    Compat, HEADER_LEN, HEADER_SEALED, KvStoreError, SnapshotBackend, decode, encode,
};
use ferrite_model::{KvType, SessionState};
use ferrite_testkit::XorShift as Rng;
use ferrite_testkit::{CountingAlloc, measure};
use sha2::{Digest, Sha256};

#[global_allocator]
static GLOBAL: CountingAlloc = CountingAlloc;

fn sample() -> (Compat, Vec<u8>) {
    let compat = Compat {
        model_sha256: [3; 32],
        arch: "gemma3".into(),
        precision: 0,
        kv_type: KvType::F16,
        ctx: 4096,
        n_layer: 4,
        kv_row: 8,
        n_vocab: 50,
        backend: SnapshotBackend::Cpu,
        state: (0, 0),
    };
    let n = 20;
    let state = SessionState {
        kv_type: KvType::F16,
        n_layer: 4,
        row: 8,
        tokens: (0..n).map(|i| i % 50).collect(),
        kv: (0..4 * 2 * n as usize * 8 * 2)
            .map(|i| (i % 256) as u8)
            .collect(),
        logits: Some(vec![0.25; 50]),
        recurrent: Default::default(),
    };
    let mut bytes = Vec::new();
    encode(&compat, &state, b"{}", &mut bytes).unwrap();
    (compat, bytes)
}

fn reseal(b: &mut [u8]) {
    let sha: [u8; 32] = Sha256::digest(&b[..HEADER_SEALED]).into();
    b[HEADER_SEALED..HEADER_LEN].copy_from_slice(&sha);
}

/// Values that stress length arithmetic.
const NASTY: [u64; 8] = [
    0,
    1,
    4095,
    4096,
    u32::MAX as u64,
    u64::MAX,
    u64::MAX / 2,
    1 << 40,
];

#[test]
fn mutated_snapshots_are_rejected_without_panic_or_oversized_allocation() {
    let (compat, good) = sample();
    assert!(decode(&mut &good[..], good.len() as u64, &compat).is_ok());
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut rejected = [0usize; 3];
    for case in 0..3000 {
        let mut b = good.clone();
        let kind = case % 3;
        match kind {
            0 => {
                // Random byte flips anywhere.
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(b.len());
                    b[at] ^= 1 << rng.below(8);
                }
            }
            1 => {
                // A header field (8-byte aligned in 112..160 and 168, or 4-byte in 8..16,
                // 100..112 and 160..168) set to a nasty value, with the header checksum
                // recomputed.
                let fields: [(usize, usize); 14] = [
                    (8, 4),
                    (12, 4),
                    (100, 4),
                    (104, 4),
                    (108, 4),
                    (112, 8),
                    (120, 8),
                    (128, 8),
                    (136, 8),
                    (144, 8),
                    (152, 8),
                    (160, 4),
                    (164, 4),
                    (168, 8),
                ];
                let (at, len) = fields[rng.below(fields.len())];
                let v = NASTY[rng.below(NASTY.len())].to_le_bytes();
                b[at..at + len].copy_from_slice(&v[..len]);
                reseal(&mut b);
            }
            _ => {
                let cut = rng.below(b.len());
                b.truncate(cut);
            }
        }
        if b == good {
            continue;
        }
        let (res, stats) = measure(|| decode(&mut &b[..], b.len() as u64, &compat));
        let largest = stats.largest;
        assert!(
            largest <= b.len().max(HEADER_LEN) + 4096,
            "case {case}: allocated {largest} for a {}-byte file",
            b.len()
        );
        match res {
            Err(KvStoreError::Corrupt(_) | KvStoreError::NotASnapshot)
            | Err(KvStoreError::Version { .. } | KvStoreError::Mismatch { .. }) => {
                rejected[kind] += 1
            }
            Err(e) => panic!("case {case}: unexpected error kind {e}"),
            Ok(_) => panic!("case {case}: a mutated file was accepted"),
        }
    }
    assert!(rejected.iter().all(|&r| r > 900), "{rejected:?}");
}
