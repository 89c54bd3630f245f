//! Every SIMD path against the scalar reference, each level pinned explicitly.
//!
//! Dequantization must be bit-exact. Dot products of a quantized row with f32 must agree
//! with the scalar order within |a - b| <= 1e-5 * sum|w x| (different summation orders of
//! the same f32 products), and must equal, bit for bit, the level's own f32 dot of the
//! dequantized row (the canonical-order contract the matmul relies on).

use ferrite_quant::kernels::{
    axpy, dot_f32, dot_row, has_fused_matvec, has_simd_dequantize, matvec,
};
use ferrite_quant::{GgmlType, SimdLevel, dequantize_with};
use ferrite_testkit::XorShift as Rng;

/// Types with a SIMD dequantizer at the AVX levels (checked below) plus the scalar-only
/// ones, which must still route correctly at every level.
const TYPES: [GgmlType; 17] = [
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
];

const HOT: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
    GgmlType::F16,
    GgmlType::BF16,
];

/// Offsets of the IEEE-half scale fields in one block, so random blocks get sane scales.
fn half_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        T::TQ1_0 => &[52],
        T::TQ2_0 => &[64],
        _ => &[],
    }
}

/// `n_blocks` random blocks of `ty` with finite, moderate scales.
fn random_blocks(rng: &mut Rng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    let ts = ty.type_size() as usize;
    let mut v: Vec<u8> = (0..n_blocks * ts).map(|_| rng.next_u64() as u8).collect();
    for b in v.chunks_exact_mut(ts) {
        match ty {
            GgmlType::F16 => b.copy_from_slice(&half::f16::from_f32(rng.f32() * 4.0).to_le_bytes()),
            GgmlType::BF16 => {
                b.copy_from_slice(&half::bf16::from_f32(rng.f32() * 4.0).to_le_bytes())
            }
            GgmlType::MXFP4 => b[0] = 110 + (rng.next_u64() % 30) as u8,
            _ => {
                for &o in half_fields(ty) {
                    let h = half::f16::from_f32(rng.f32() * 0.05);
                    b[o..o + 2].copy_from_slice(&h.to_le_bytes());
                }
            }
        }
    }
    v
}

fn sizes(ty: GgmlType) -> [usize; 5] {
    // Block counts: one, odd small, odd medium, large (about 1M values for 32-blocks).
    let large = if ty.block_size() == 1 {
        1 << 16
    } else {
        (1 << 20) / ty.block_size() as usize
    };
    [1, 3, 7, 33, large + 1]
}

#[test]
fn hot_formats_have_simd_dequant_at_vector_levels() {
    for level in vector_levels() {
        for ty in HOT.into_iter().filter(|&t| fused(level, t)) {
            assert!(
                has_simd_dequantize(level, ty),
                "{ty} has no {level} dequantizer"
            );
        }
    }
}

#[test]
fn simd_dequant_is_bit_exact_and_dots_agree() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for level in vector_levels() {
        for ty in TYPES {
            let mut worst = 0f64;
            for nb in sizes(ty) {
                let bytes = random_blocks(&mut rng, ty, nb);
                let n = nb * ty.block_size() as usize;
                let mut want = vec![0f32; n];
                let mut got = vec![0f32; n];
                dequantize_with(SimdLevel::Scalar, ty, &bytes, &mut want).expect("scalar");
                dequantize_with(level, ty, &bytes, &mut got).expect("simd");
                let bad = want
                    .iter()
                    .zip(&got)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(bad, None, "{ty} {level} {nb} blocks: dequant differs");

                let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
                let s = dot_row(SimdLevel::Scalar, ty, &bytes, &x).expect("scalar dot");
                let v = dot_row(level, ty, &bytes, &x).expect("simd dot");
                let canon = dot_f32(level, &got, &x).expect("f32 dot");
                assert_eq!(
                    v.to_bits(),
                    canon.to_bits(),
                    "{ty} {level}: dot_row not canonical"
                );
                let abs: f64 = want
                    .iter()
                    .zip(&x)
                    .map(|(w, x)| f64::from(w * x).abs())
                    .sum();
                let err = f64::from((v - s).abs());
                assert!(
                    v.is_finite() && err <= 1e-5 * abs,
                    "{ty} {level} {nb}: {v} vs {s}"
                );
                worst = worst.max(err / abs.max(1e-30));
            }
            println!(
                "simd parity {ty} [{level}{}]: dequant bit-exact, dot max err/sum|wx| {worst:.1e}",
                if has_simd_dequantize(level, ty) {
                    " simd"
                } else {
                    " scalar-dequant"
                }
            );
        }
    }
}

#[test]
fn f32_kernels_handle_tails_at_every_level() {
    let mut rng = Rng(7);
    for level in SimdLevel::ALL {
        if !level.is_available() {
            println!("skipped: {level} not available on this CPU");
            continue;
        }
        for k in [1usize, 7, 8, 15, 16, 17, 100, 1000] {
            let w: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
            let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
            let exact: f64 = w
                .iter()
                .zip(&x)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum();
            let abs: f64 = w.iter().zip(&x).map(|(a, b)| f64::from(a * b).abs()).sum();
            let got = dot_f32(level, &w, &x).expect("dot");
            assert!(
                (f64::from(got) - exact).abs() <= 1e-5 * abs + 1e-30,
                "{level} k={k}"
            );
        }
    }
}

#[test]
fn matvec_equals_dot_row_bit_for_bit_at_every_level() {
    let mut rng = Rng(0xfeed);
    for level in SimdLevel::ALL {
        if !level.is_available() {
            println!("skipped: {level} not available on this CPU");
            continue;
        }
        for ty in TYPES.into_iter().chain([GgmlType::F32]) {
            for (n_rows, nb) in [(1usize, 1usize), (3, 3), (5, 7), (9, 2)] {
                let row_bytes = nb * ty.type_size() as usize;
                let bytes = if ty == GgmlType::F32 {
                    (0..n_rows * nb)
                        .flat_map(|_| rng.f32().to_le_bytes())
                        .collect()
                } else {
                    random_blocks(&mut rng, ty, n_rows * nb)
                };
                let k = nb * ty.block_size() as usize;
                let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
                let mut y = vec![f32::NAN; n_rows];
                matvec(level, ty, &bytes, &x, &mut y).expect("matvec");
                for (r, got) in y.iter().enumerate() {
                    let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                    let want = dot_row(level, ty, row, &x).expect("dot_row");
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} {level} rows {n_rows} k {k} r {r}"
                    );
                }
            }
            println!(
                "matvec {ty} [{level}{}]: equals dot_row bit for bit",
                if has_fused_matvec(level, ty) {
                    " fused"
                } else {
                    ""
                }
            );
        }
    }
}

/// `axpy` at every available level agrees with the scalar order within one rounding per
/// element (the SIMD levels fuse the multiply-add), at lengths that exercise the tail.
#[test]
fn axpy_matches_scalar_at_every_level() {
    let mut rng = Rng(0x5eed_a9e1);
    for len in [1usize, 7, 16, 17, 33, 256, 1000] {
        let x: Vec<f32> = (0..len).map(|_| rng.f32()).collect();
        let y0: Vec<f32> = (0..len).map(|_| rng.f32()).collect();
        let a = rng.f32();
        let mut want = y0.clone();
        axpy(SimdLevel::Scalar, a, &x, &mut want).unwrap();
        for level in vector_levels() {
            let mut got = y0.clone();
            axpy(level, a, &x, &mut got).unwrap();
            for i in 0..len {
                let bound = 2.0 * f32::EPSILON * (a * x[i]).abs().max(y0[i].abs()).max(1e-30);
                assert!(
                    (got[i] - want[i]).abs() <= bound,
                    "{level} len {len} at {i}: {} vs {}",
                    got[i],
                    want[i]
                );
            }
        }
    }
}

/// Whether `ty`'s matvec at `level` is fused (blocks decoded in registers and fed to the
/// FMA accumulators, no row dequantized to memory): at the AVX levels every type with a
/// SIMD dequantizer there; at NEON the same less F16.
fn fused(level: SimdLevel, ty: GgmlType) -> bool {
    use GgmlType as T;
    let neon = Some(level) == SimdLevel::from_name("neon");
    let unfused = matches!(ty, T::Q2_K | T::Q3_K | T::TQ1_0 | T::TQ2_0);
    !(unfused || neon && ty == T::F16)
}

/// The vector levels of this target (AVX2 and AVX-512, or NEON) this CPU has, printing a
/// skip line for each it lacks.
fn vector_levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|&level| level != SimdLevel::Scalar)
        .filter(|level| {
            let here = level.is_available();
            if !here {
                println!("skipped: {level} not available on this CPU");
            }
            here
        })
        .collect()
}

/// The fused matvec of every format at each vector level, against an oracle that shares none
/// of its decoding: the scalar reference dequantizer, then the level's f32 dot (the
/// canonical order). Row counts cover one, two, three and four rows per group and a
/// remainder after whole groups; widths cover one and several blocks (and, for the float
/// formats, a width AVX2 fuses but AVX-512 does not). Equal bits, every output.
#[test]
fn fused_matvec_equals_scalar_dequant_then_level_dot_bit_for_bit() {
    let mut rng = Rng(0xa5a5_0f0f);
    for level in vector_levels() {
        for ty in TYPES.into_iter().filter(|&t| fused(level, t)) {
            assert!(
                has_fused_matvec(level, ty),
                "{ty} has no fused {level} matvec"
            );
            let bs = ty.block_size() as usize;
            let mut ks = vec![256, 768];
            if bs == 32 {
                ks.push(160);
            }
            if bs == 1 {
                ks.push(24);
            }
            for k in ks {
                for n_rows in [1usize, 2, 3, 4, 5, 8, 11] {
                    let nb = k / bs;
                    let row_bytes = nb * ty.type_size() as usize;
                    let bytes = random_blocks(&mut rng, ty, n_rows * nb);
                    let x: Vec<f32> = (0..k).map(|_| rng.f32()).collect();
                    let mut y = vec![f32::NAN; n_rows];
                    matvec(level, ty, &bytes, &x, &mut y).expect("matvec");
                    for (r, got) in y.iter().enumerate() {
                        let mut w = vec![0f32; k];
                        let row = &bytes[r * row_bytes..(r + 1) * row_bytes];
                        dequantize_with(SimdLevel::Scalar, ty, row, &mut w).expect("scalar");
                        let want = dot_f32(level, &w, &x).expect("dot");
                        assert!(got.is_finite(), "{ty} {level} k {k} row {r}: {got}");
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{ty} {level} rows {n_rows} k {k} row {r}: {got} vs {want}"
                        );
                    }
                }
            }
            println!("fused matvec {ty} [{level}]: scalar dequant + {level} dot, bit for bit");
        }
    }
}
