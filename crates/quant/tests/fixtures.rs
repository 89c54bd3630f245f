//! Oracle: dequantization equals gguf-py's float32 output bit for bit, for every format in
//! the fixture manifest (fixtures/reference/quant, or the directory named by
//! `FERRITE_QUANT_FIXTURES`). Fails closed: an empty manifest, a missing file or an
//! unsupported listed format is a failure, never a skip.

use std::path::{Path, PathBuf};

use ferrite_quant::{GgmlType, SimdLevel, dequantize_with};

struct Case {
    ty: GgmlType,
    n_blocks: usize,
    bin: Vec<u8>,
    expected: Vec<f32>,
}

fn fixture_dir() -> PathBuf {
    match std::env::var_os("FERRITE_QUANT_FIXTURES") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/reference/quant"),
    }
}

fn load_cases() -> Vec<Case> {
    let dir = fixture_dir();
    let manifest = std::fs::read_to_string(dir.join("MANIFEST.json"))
        .unwrap_or_else(|e| panic!("cannot read {}/MANIFEST.json: {e}", dir.display()));
    let v: serde_json::Value = serde_json::from_str(&manifest).expect("MANIFEST.json is JSON");
    let types = v["types"]
        .as_array()
        .expect("MANIFEST.json has a types array");
    assert!(
        !types.is_empty(),
        "fixture manifest in {} lists no vectors",
        dir.display()
    );
    types
        .iter()
        .map(|t| {
            let name = t["type"].as_str().expect("type name");
            let ty = GgmlType::from_name(name).unwrap_or_else(|| panic!("unknown type {name}"));
            assert_eq!(
                u64::from(ty.id()),
                t["ggml_type_id"].as_u64().expect("id"),
                "{name} id"
            );
            assert_eq!(
                ty.block_size(),
                t["block_size"].as_u64().expect("block_size")
            );
            assert_eq!(ty.type_size(), t["type_size"].as_u64().expect("type_size"));
            let read = |key: &str| {
                let f = dir.join(t[key].as_str().expect("file name"));
                std::fs::read(&f).unwrap_or_else(|e| panic!("missing {}: {e}", f.display()))
            };
            let bin = read("bin");
            let expected: Vec<f32> = read("f32")
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            let n_blocks = t["n_blocks"].as_u64().expect("n_blocks") as usize;
            assert_eq!(
                expected.len() as u64,
                t["n_values"].as_u64().expect("n_values")
            );
            assert_eq!(
                bin.len() as u64,
                n_blocks as u64 * ty.type_size(),
                "{name} bin size"
            );
            Case {
                ty,
                n_blocks,
                bin,
                expected,
            }
        })
        .collect()
}

/// The index of the first value whose bits differ, if any.
fn first_mismatch(got: &[f32], want: &[f32]) -> Option<usize> {
    if got.len() != want.len() {
        return Some(got.len().min(want.len()));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a.to_bits() != b.to_bits())
}

fn dequant(level: SimdLevel, c: &Case, bin: &[u8]) -> Vec<f32> {
    let mut out = vec![0f32; c.expected.len()];
    dequantize_with(level, c.ty, bin, &mut out)
        .unwrap_or_else(|e| panic!("{} listed in the manifest but not supported: {e}", c.ty));
    out
}

#[test]
fn dequantize_matches_fixtures_bit_for_bit() {
    let cases = load_cases();
    for level in SimdLevel::ALL {
        if !level.is_available() {
            println!("skipped: level {level} not available on this CPU");
            continue;
        }
        for c in &cases {
            let got = dequant(level, c, &c.bin);
            if let Some(i) = first_mismatch(&got, &c.expected) {
                panic!(
                    "{} at level {level}: value {i} is {:e} ({:#010x}), expected {:e} ({:#010x})",
                    c.ty,
                    got[i],
                    got[i].to_bits(),
                    c.expected[i],
                    c.expected[i].to_bits()
                );
            }
            println!(
                "quant fixture {} [{level}{}]: {} blocks, {} values bit-exact",
                c.ty,
                if ferrite_quant::kernels::has_simd_dequantize(level, c.ty) {
                    " simd"
                } else {
                    ""
                },
                c.n_blocks,
                got.len()
            );
        }
    }
}

/// Test of the test: corrupting one quant nibble, and separately one scale bit, of one block
/// must make the bit-exact comparison fail.
#[test]
fn comparison_detects_flipped_nibble_and_scale_bit() {
    let cases = load_cases();
    let c = cases
        .iter()
        .find(|c| c.ty == GgmlType::Q4_K)
        .expect("fixtures include Q4_K");
    // Q4_K block: d(2) dmin(2) scales(12) qs(128). Flip a nibble in the quants of block 3
    // and, separately, the lowest bit of its first sub-block scale.
    let ts = c.ty.type_size() as usize;
    let mut nibble = c.bin.clone();
    nibble[3 * ts + 16 + 5] ^= 0x0f;
    let mut scale = c.bin.clone();
    scale[3 * ts + 4] ^= 0x01;
    for (what, bin) in [("nibble", nibble), ("scale bit", scale)] {
        let got = dequant(SimdLevel::Scalar, c, &bin);
        assert!(
            first_mismatch(&got, &c.expected).is_some(),
            "flipping a {what} went unnoticed"
        );
    }
    let clean = dequant(SimdLevel::Scalar, c, &c.bin);
    assert_eq!(first_mismatch(&clean, &c.expected), None);
}
