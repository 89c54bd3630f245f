//! The multi-column matvec against the single-column one, bit for bit, at every available
//! level (each pinned explicitly): the canonical-order contract that makes a batched decode
//! step give each session exactly the bits of stepping it alone.

use ferrite_quant::kernels::{has_fused_multi_matvec, matvec, multi_matvec};
use ferrite_quant::{GgmlType, SimdLevel};
use ferrite_testkit::XorShift as Rng;

/// The formats of the two development models plus the other fused AVX-512 kernels and two
/// formats without one (Q5_K, Q3_K: column by column).
const TYPES: [GgmlType; 14] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::MXFP4,
    GgmlType::Q3_K,
];

/// Offsets of the IEEE-half scale fields in one block, so random blocks get sane scales.
fn half_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `k` values of `ty` with finite, moderate scales.
fn random_rows(rng: &mut Rng, ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let bs = ty.block_size() as usize;
    let ts = ty.type_size() as usize;
    let mut v: Vec<u8> = (0..rows * k / bs * ts)
        .map(|_| rng.next_u64() as u8)
        .collect();
    for b in v.chunks_exact_mut(ts) {
        match ty {
            GgmlType::F32 => b.copy_from_slice(&rng.f32().to_le_bytes()),
            GgmlType::F16 => b.copy_from_slice(&half::f16::from_f32(rng.f32()).to_le_bytes()),
            GgmlType::BF16 => b.copy_from_slice(&half::bf16::from_f32(rng.f32()).to_le_bytes()),
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

/// Row lengths: one block, odd block counts (one past a 512-value chunk boundary), and for
/// the unblocked float formats lengths with a partial vector.
fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size() as usize;
    if bs == 1 {
        vec![16, 48, 23, 531]
    } else {
        vec![bs, 3 * bs, (512 / bs + 1) * bs]
    }
}

#[test]
fn multi_column_equals_single_column_bit_for_bit() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
        for ty in TYPES {
            for k in lengths(ty) {
                for rows in [1, 3, 7] {
                    let w = random_rows(&mut rng, ty, rows, k);
                    for n in [1, 2, 3, 4, 5, 7, 8, 16, 17] {
                        let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
                        let mut got = vec![f32::NAN; n * rows];
                        multi_matvec(level, ty, &w, &x, n, &mut got).expect("multi");
                        for t in 0..n {
                            let mut want = vec![0f32; rows];
                            matvec(level, ty, &w, &x[t * k..(t + 1) * k], &mut want)
                                .expect("matvec");
                            for r in 0..rows {
                                assert_eq!(
                                    got[t * rows + r].to_bits(),
                                    want[r].to_bits(),
                                    "{level} {ty} k={k} rows={rows} n={n} column {t} row {r}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn model_formats_have_fused_kernels_at_avx512() {
    let level = SimdLevel::Avx512;
    if !level.is_available() {
        println!("skipped: {level} not available on this CPU");
        return;
    }
    for ty in TYPES {
        let want = !matches!(ty, GgmlType::Q5_K | GgmlType::Q3_K);
        assert_eq!(has_fused_multi_matvec(level, ty, 256), want, "{ty}");
    }
    // A partial 16-value vector takes the column-by-column path.
    assert!(!has_fused_multi_matvec(level, GgmlType::F32, 23));
    assert!(!has_fused_multi_matvec(
        SimdLevel::Avx2,
        GgmlType::Q4_1,
        256
    ));
}

#[test]
fn bad_shapes_are_errors() {
    let level = SimdLevel::Scalar;
    let ty = GgmlType::Q8_0;
    let w = vec![0u8; 2 * 34];
    let mut y = [0f32; 4];
    assert!(multi_matvec(level, ty, &w, &[0.0; 64], 2, &mut y).is_ok());
    assert!(multi_matvec(level, ty, &w, &[0.0; 64], 0, &mut y).is_err());
    assert!(multi_matvec(level, ty, &w, &[0.0; 63], 2, &mut y).is_err());
    assert!(multi_matvec(level, ty, &w, &[0.0; 64], 2, &mut y[..3]).is_err());
    assert!(multi_matvec(level, ty, &w[..34], &[0.0; 64], 2, &mut y).is_err());
    assert!(multi_matvec(level, ty, &w, &[0.0; 48], 2, &mut y).is_err());
}
