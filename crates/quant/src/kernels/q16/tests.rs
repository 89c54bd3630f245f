//! Oracle: a scalar transcription of the product the module docs define (integer block
//! sums, then the scale steps in block order with `f32::mul_add`), which every kernel must
//! match bit for bit; and an f64 product of the dequantized weights with the original
//! activations, which bounds what the 16-bit rounding costs.

use super::*;
use crate::{dequantize_ref, quantize as quantize_weights};
use ferrite_testkit::XorShift as Rng;

/// Every type with 16-bit products at some level (Q5_0, Q4_K and Q6_K at AVX2 only).
const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_1,
    GgmlType::Q8_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// A row width of about `k` values that `ty`'s rows can have: `k` itself, or for the
/// 256-value super-blocks of the K-quants, `k / 32` of them.
fn width(ty: GgmlType, k: usize) -> usize {
    if ty.block_size() == 256 {
        k / BLOCK * 256
    } else {
        k
    }
}

/// One 32-value block as the module docs read it: integer weights, the scales of its two
/// 16-value halves (equal but for Q6_K) and its minimum (zero without one).
struct Blk {
    q: [i32; BLOCK],
    d: [f32; 2],
    m: f32,
}

/// The types with 16-bit products at `level`.
fn types_at(level: SimdLevel) -> Vec<GgmlType> {
    TYPES.into_iter().filter(|&t| applies(level, t)).collect()
}

fn weights(rng: &mut Rng, ty: GgmlType, rows: usize, k: usize) -> Vec<u8> {
    let vals: Vec<f32> = (0..rows * k).map(|_| rng.f32()).collect();
    let mut data = vec![0u8; rows * ty.row_bytes(k as u64).expect("whole blocks") as usize];
    quantize_weights(ty, &vals, &mut data).expect("quantize");
    data
}

/// Each 32-value block of a row of `k` values, read from its raw bytes.
fn row_blocks(ty: GgmlType, row: &[u8], k: usize) -> Vec<Blk> {
    let half = |blk: &[u8], o: usize| half::f16::from_le_bytes([blk[o], blk[o + 1]]).to_f32();
    let blk = |q, d, m| Blk { q, d: [d, d], m };
    if ty == GgmlType::Q6_K {
        // ql (128 bytes), qh (64), 16 signed scales, d: value e = 128c + r is nibble r / 64
        // of ql byte 64c + r % 64 with bits 2(r / 32).. of qh byte 32c + r % 32 above it.
        return row
            .chunks_exact(210)
            .flat_map(|b| {
                let d = half(b, 208);
                (0..8).map(move |j| {
                    let q = std::array::from_fn(|l| {
                        let e = 32 * j + l;
                        let (c, r) = (e / 128, e % 128);
                        let lo = (b[64 * c + r % 64] >> (4 * (r / 64))) & 15;
                        let hi = (b[128 + 32 * c + r % 32] >> (2 * (r / 32))) & 3;
                        i32::from(lo | (hi << 4)) - 32
                    });
                    let sc = |g: usize| d * f32::from(b[192 + g] as i8);
                    Blk {
                        q,
                        d: [sc(2 * j), sc(2 * j + 1)],
                        m: 0.0,
                    }
                })
            })
            .collect();
    }
    if ty == GgmlType::Q4_K {
        // d, dmin, 12 bytes of 6-bit scales and minimums, then sub-block j in the low (j
        // even) or high nibbles of bytes 32(j / 2)..+32.
        return row
            .chunks_exact(144)
            .flat_map(|blk| {
                let sc: &[u8; 12] = blk[4..16].try_into().expect("scales");
                (0..8).map(move |j| {
                    let (s, m) = crate::kquants::scale_min_k4(j, sc);
                    let q = std::array::from_fn(|l| {
                        i32::from((blk[16 + 32 * (j / 2) + l] >> (4 * (j % 2))) & 15)
                    });
                    Blk {
                        q,
                        d: [half(blk, 0) * f32::from(s); 2],
                        m: -(half(blk, 2) * f32::from(m)),
                    }
                })
            })
            .collect();
    }
    let bytes = ty.row_bytes(32).expect("block") as usize;
    row[..k / BLOCK * bytes]
        .chunks_exact(bytes)
        .map(|b| {
            if ty == GgmlType::Q4_1 {
                let q = std::array::from_fn(|i| {
                    i32::from(if i < 16 {
                        b[4 + i] & 15
                    } else {
                        b[4 + i - 16] >> 4
                    })
                });
                blk(q, half(b, 0), half(b, 2))
            } else if ty == GgmlType::Q5_0 {
                // d, then qh (bit j: the fifth bit of value j), then the low nibbles.
                let qh = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                let q = std::array::from_fn(|i| {
                    let lo = if i < 16 {
                        b[6 + i] & 15
                    } else {
                        b[6 + i - 16] >> 4
                    };
                    i32::from(lo) + 16 * ((qh >> i) & 1) as i32 - 16
                });
                blk(q, half(b, 0), 0.0)
            } else {
                let q = std::array::from_fn(|i| i32::from(b[2 + i] as i8));
                blk(q, half(b, 0), 0.0)
            }
        })
        .collect()
}

/// The module docs' product, one output at a time.
fn reference(ty: GgmlType, w: &[u8], nr: usize, x: &[f32], k: usize, n: usize) -> Vec<f32> {
    let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
    let mut out = vec![0f32; n * nr];
    for r in 0..nr {
        let blocks = row_blocks(ty, &w[r * rb..][..rb], k);
        for c in 0..n {
            let mut acc = 0f32;
            for (b, w) in blocks.iter().enumerate() {
                let a: &[f32; BLOCK] = x[c * k + b * BLOCK..][..BLOCK].try_into().expect("block");
                let (q, s, total) = quantize_block(a);
                let dot = |r: std::ops::Range<usize>| -> i32 {
                    r.map(|i| w.q[i] * i32::from(q[i])).sum()
                };
                if ty == GgmlType::Q6_K {
                    acc = (dot(0..16) as f32).mul_add(w.d[0] * s, acc);
                    acc = (dot(16..32) as f32).mul_add(w.d[1] * s, acc);
                } else {
                    acc = (dot(0..32) as f32).mul_add(w.d[0] * s, acc);
                }
                if matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K) {
                    acc = w.m.mul_add(total, acc);
                }
            }
            out[c * nr + r] = acc;
        }
    }
    out
}

/// The integers, scales and minimums the reference reads are the weights: `d · q + m`
/// (`d · q` without a minimum; one rounding each) is the fixture-pinned scalar
/// dequantization bit for bit.
#[test]
fn block_integers_rebuild_the_reference_dequantization() {
    let mut rng = Rng(0xb10c);
    for ty in TYPES {
        let (nr, k) = (3, width(ty, 96));
        let w = weights(&mut rng, ty, nr, k);
        let mut want = vec![0f32; nr * k];
        dequantize_ref(ty, &w, &mut want).expect("dequantize");
        let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
        for r in 0..nr {
            for (b, blk) in row_blocks(ty, &w[r * rb..][..rb], k).iter().enumerate() {
                for (i, &q) in blk.q.iter().enumerate() {
                    let v = blk.d[i / 16] * q as f32;
                    // Only a format with a minimum adds it (`-0 + 0` would be `+0`).
                    let has_min = matches!(ty, GgmlType::Q4_1 | GgmlType::Q4_K);
                    let got = if has_min { v + blk.m } else { v };
                    let want = want[r * k + b * BLOCK + i];
                    assert_eq!(got.to_bits(), want.to_bits(), "{ty} row {r} block {b} {i}");
                }
            }
        }
    }
}

/// `out[c * stride + r]` equals `want[c * nr + r]` bit for bit for every column and row.
fn assert_same_bits(ty: GgmlType, k: usize, out: &[f32], stride: usize, want: &[f32], nr: usize) {
    for (c, want) in want.chunks_exact(nr).enumerate() {
        for (r, want) in want.iter().enumerate() {
            let got = out[c * stride + r];
            assert_eq!(
                got.to_bits(),
                want.to_bits(),
                "{ty} {nr}x{k} c={c} r={r}: {got} vs {want}"
            );
        }
    }
}

/// The layouts `level` can multiply: the pairs always; the bytes on AVX2 (moved to pairs
/// first) and, on AVX-512, where AMX is available.
fn layouts(level: SimdLevel) -> Vec<Layout> {
    if level == SimdLevel::Avx2 || amx_available() {
        vec![Layout::Pairs, Layout::Bytes]
    } else {
        println!("AMX kernel skipped: no AMX INT8 on this CPU (or FERRITE_AMX=off)");
        vec![Layout::Pairs]
    }
}

/// The quantized blocks' words, without the slack.
fn words(acts: &Q16Acts) -> &[u32] {
    &acts.pairs[..acts.scale.len() * PAIRS]
}

/// [`quantize`] into the given layout.
fn quantize_as(ty: GgmlType, x: &[f32], k: usize, n: usize, layout: Layout) -> Q16Acts {
    let mut acts = Q16Acts::empty();
    acts.fills_as(ty, x, k, n, 1, layout)
        .expect("quantize")
        .for_each(Q16Fill::run);
    acts
}

/// The levels with 16-bit product kernels on this CPU, each named in the output.
fn levels() -> Vec<SimdLevel> {
    let levels: Vec<SimdLevel> = [SimdLevel::Avx512, SimdLevel::Avx2]
        .into_iter()
        .filter(|&l| {
            let ok = applies(l, GgmlType::Q4_1);
            if !ok {
                println!("skipped: no {l} 16-bit product kernels on this CPU");
            }
            ok
        })
        .collect();
    println!("16-bit product kernels tested: {levels:?}");
    levels
}

#[test]
fn pair_orders_are_permutations() {
    for ty in TYPES {
        let mut seen = pair_order(ty);
        seen.sort_unstable();
        assert_eq!(seen, std::array::from_fn(|i| i), "{ty}");
    }
}

#[test]
fn blocks_quantize_as_documented() {
    let mut a = [0f32; BLOCK];
    assert_eq!(quantize_block(&a), ([0; BLOCK], 0.0, 0.0));
    // amax = 32767 / 16384 makes the reciprocal exactly 16384 and s exactly 1 / 16384.
    a[3] = -32767.0 / 16384.0;
    a[5] = 2.5 / 16384.0;
    a[7] = 3.5 / 16384.0;
    let (q, s, total) = quantize_block(&a);
    assert_eq!((q[3], q[5], q[7]), (-32767, 2, 4), "ties round to even");
    assert_eq!(s, 1.0 / 16384.0);
    assert_eq!(total, s * (-32767 + 2 + 4) as f32);
    a[9] = f32::NAN;
    let (q, s, total) = quantize_block(&a);
    assert!(q.iter().all(|&v| v == 0) && s.is_nan() && total.is_nan());
    let tiny = [1e-45f32; BLOCK];
    assert_eq!(
        quantize_block(&tiny).1,
        0.0,
        "an unscalable block counts as zeros"
    );
}

/// In the byte layout, each block's slot holds the 16-bit values of `quantize_block` as
/// `256 · hi + lo`: hi bytes (signed) first, then lo bytes (unsigned), in natural order.
#[test]
fn the_byte_layout_holds_the_16_bit_values() {
    let mut rng = Rng(23);
    let (k, n) = (96, 5);
    let mut x: Vec<f32> = (0..n * k).map(|_| rng.f32() * 3.0).collect();
    x[40] = 0.0;
    x[33] = -1e-3;
    for ty in TYPES {
        let acts = quantize_as(ty, &x, k, n, Layout::Bytes);
        for t in 0..acts.tiles() {
            let (width, slots, _, _) = acts.tile(t);
            for (i, slot) in slots[..width * (k / BLOCK) * PAIRS]
                .chunks_exact(PAIRS)
                .enumerate()
            {
                let (c, b) = (t * 16 + i % width, i / width);
                let a: &[f32; BLOCK] = x[c * k + b * BLOCK..][..BLOCK].try_into().expect("block");
                let (q, _, _) = quantize_block(a);
                let bytes: Vec<u8> = slot.iter().flat_map(|w| w.to_le_bytes()).collect();
                for (j, &v) in q.iter().enumerate() {
                    let got = 256 * i32::from(bytes[j] as i8) + i32::from(bytes[BLOCK + j]);
                    assert_eq!(got, i32::from(v), "{ty} column {c} block {b} value {j}");
                }
            }
        }
    }
}

/// The vector quantizers this CPU can run, by level.
#[cfg(target_arch = "x86_64")]
type VectorQuantizer = unsafe fn(&[f32; BLOCK], &[u16; BLOCK], &mut [u32; PAIRS]) -> (f32, f32);

#[cfg(target_arch = "x86_64")]
fn vector_quantizers() -> Vec<(SimdLevel, VectorQuantizer)> {
    let mut found: Vec<(SimdLevel, VectorQuantizer)> = Vec::new();
    if applies(SimdLevel::Avx512, GgmlType::Q4_1) {
        found.push((
            SimdLevel::Avx512,
            crate::kernels::avx512_q16::quantize_block,
        ));
    }
    if applies(SimdLevel::Avx2, GgmlType::Q4_1) {
        found.push((SimdLevel::Avx2, crate::kernels::avx2_q16::quantize_block));
    }
    found
}

#[test]
#[cfg(target_arch = "x86_64")]
fn the_vector_quantizers_match_the_scalar_one() {
    let quantizers = vector_quantizers();
    if quantizers.is_empty() {
        println!("skipped: no AVX2 on this CPU");
        return;
    }
    for (level, vector) in quantizers {
        println!("vector quantizer at {level:?}");
        vector_quantizer_matches(vector);
    }
}

#[cfg(target_arch = "x86_64")]
fn vector_quantizer_matches(vector: VectorQuantizer) {
    let mut rng = Rng(17);
    for ty in TYPES {
        let order = pair_order(ty);
        for case in 0..240 {
            // XorShift::f32 is uniform in [-1, 1): the largest |a| is positive or negative.
            let mut a: [f32; BLOCK] = std::array::from_fn(|_| rng.f32() * 4.0);
            match case % 6 {
                1 => a = [0.0; BLOCK],
                2 => a[case % BLOCK] = f32::NAN,
                3 => a = std::array::from_fn(|i| i as f32 * 1e-44),
                4 => a[case % BLOCK] = -f32::INFINITY,
                // amax 2 scales by 16383.5: ±1 land on the ties ±16383.5, which round to
                // even.
                5 => a = std::array::from_fn(|i| (i % 5) as f32 - 2.0),
                _ => {}
            }
            let (q, s, t) = quantize_block(&a);
            let mut pairs = [0u32; PAIRS];
            // SAFETY: vector_quantizers() lists only levels this CPU runs.
            let (vs, vt) = unsafe { vector(&a, &order.map(|o| o as u16), &mut pairs) };
            assert_eq!(
                (s.to_bits(), t.to_bits()),
                (vs.to_bits(), vt.to_bits()),
                "{ty} case {case}"
            );
            for (p, pair) in pairs.iter().enumerate() {
                let want = u32::from(q[order[2 * p]] as u16)
                    | (u32::from(q[order[2 * p + 1]] as u16) << 16);
                assert_eq!(*pair, want, "{ty} case {case} pair {p}");
            }
        }
    }
}

#[test]
fn kernels_match_the_documented_product_bit_for_bit() {
    for level in levels() {
        kernels_match_at(level);
    }
}

fn kernels_match_at(level: SimdLevel) {
    let mut rng = Rng(0x51ed_2701);
    for ty in types_at(level) {
        for (nr, k) in [(1, 32), (15, 64), (16, 96), (17, 32), (37, 160)] {
            let k = width(ty, k);
            let w = weights(&mut rng, ty, nr, k);
            for (n, layout) in [1, 2, 3, 4, 5, 8, 15, 16, 17, 33]
                .into_iter()
                .flat_map(|n| layouts(level).into_iter().map(move |l| (n, l)))
            {
                let x: Vec<f32> = (0..n * k).map(|_| rng.f32() * 2.0).collect();
                let acts = quantize_as(ty, &x, k, n, layout);
                let stride = nr + 3;
                let mut out = vec![f32::NAN; (n - 1) * stride + nr];
                matmul(level, &w, nr, &acts, &mut out, stride).expect("matmul");
                let want = reference(ty, &w, nr, &x, k, n);
                assert_same_bits(ty, k, &out, stride, &want, nr);
            }
        }
    }
}

#[test]
fn rounding_costs_little_against_f32_activations() {
    for level in levels() {
        rounding_costs_little_at(level);
    }
}

fn rounding_costs_little_at(level: SimdLevel) {
    let mut rng = Rng(99);
    for ty in types_at(level) {
        let (nr, k, n) = (33, width(ty, 576), 4);
        let w = weights(&mut rng, ty, nr, k);
        let mut wf = vec![0f32; nr * k];
        dequantize_ref(ty, &w, &mut wf).expect("dequantize");
        let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
        let acts = quantize(ty, &x, k, n).expect("quantize");
        let mut out = vec![0f32; n * nr];
        matmul(level, &w, nr, &acts, &mut out, nr).expect("matmul");
        let mut worst = 0f64;
        for c in 0..n {
            for r in 0..nr {
                let (mut s, mut a) = (0f64, 0f64);
                for i in 0..k {
                    let p = f64::from(wf[r * k + i]) * f64::from(x[c * k + i]);
                    s += p;
                    a += p.abs();
                }
                worst = worst.max((f64::from(out[c * nr + r]) - s).abs() / a);
            }
        }
        println!("{ty} [{level}]: max |err| / sum|wx| = {worst:.2e}");
        assert!(worst < 1e-4, "{ty}: 16-bit rounding error {worst:.2e}");
    }
}

#[test]
fn non_finite_activations_give_nan_outputs() {
    for (level, ty) in levels()
        .into_iter()
        .flat_map(|l| types_at(l).into_iter().map(move |t| (l, t)))
    {
        let mut rng = Rng(5);
        let k = width(ty, 64);
        let w = weights(&mut rng, ty, 3, k);
        let mut x = vec![0.5f32; k];
        x[40] = f32::INFINITY;
        let acts = quantize(ty, &x, k, 1).expect("quantize");
        let mut out = [0f32; 3];
        matmul(level, &w, 3, &acts, &mut out, 3).expect("matmul");
        assert!(out.iter().all(|v| v.is_nan()), "{ty} {level}: {out:?}");
    }
}

#[test]
fn bad_shapes_are_errors() {
    let x = vec![0f32; 64];
    assert!(quantize(GgmlType::Q5_K, &x, 64, 1).is_err());
    assert!(quantize(GgmlType::Q4_1, &x, 48, 1).is_err());
    assert!(quantize(GgmlType::Q4_1, &x, 32, 3).is_err());
    let acts = quantize(GgmlType::Q4_1, &x, 32, 2).expect("quantize");
    let w = vec![0u8; 2 * 20];
    let mut out = vec![0f32; 4];
    assert!(matmul(SimdLevel::Scalar, &w, 2, &acts, &mut out, 2).is_err());
    for level in levels() {
        assert!(matmul(level, &w[..39], 2, &acts, &mut out, 2).is_err());
        assert!(matmul(level, &w, 2, &acts, &mut out[..3], 2).is_err());
        assert!(matmul(level, &w, 2, &acts, &mut out, 1).is_err());
        assert!(matmul(level, &w, 2, &acts, &mut out, 2).is_ok());
    }
}

#[test]
fn packed_rows_match_the_documented_product_bit_for_bit() {
    for level in levels() {
        packed_rows_match_at(level);
    }
}

fn packed_rows_match_at(level: SimdLevel) {
    let mut rng = Rng(0x7ac4_ed01);
    for ty in types_at(level) {
        // Odd block counts leave Q8_0 groups padded to whole lines; 37 and 17 rows end on a
        // partial group.
        for (nr, k) in [(1, 32), (16, 96), (17, 32), (37, 160), (48, 64)] {
            let k = width(ty, k);
            let w = weights(&mut rng, ty, nr, k);
            let packed = PackedRows::new(level, ty, &w, nr, k, |_| {}).expect("pack");
            assert_eq!(packed.groups(), nr.div_ceil(GROUP_ROWS));
            for (n, layout) in [1, 3, 8, 9, 16, 19]
                .into_iter()
                .flat_map(|n| layouts(level).into_iter().map(move |l| (n, l)))
            {
                let x: Vec<f32> = (0..n * k).map(|_| rng.f32() * 2.0).collect();
                let acts = quantize_as(ty, &x, k, n, layout);
                let want = reference(ty, &w, nr, &x, k, n);
                let stride = nr + 5;
                let mut out = vec![f32::NAN; (n - 1) * stride + nr];
                // The groups in two calls, as two threads would split them.
                let mid = packed.groups() / 2;
                for groups in [0..mid, mid..packed.groups()] {
                    // SAFETY: out holds (n - 1) * stride + nr values: every row of every
                    // column.
                    unsafe {
                        matmul_packed_to(level, &packed, groups, &acts, out.as_mut_ptr(), stride)
                    }
                    .expect("matmul");
                }
                assert_same_bits(ty, k, &out, stride, &want, nr);
            }
        }
    }
}

#[test]
fn packed_rows_refuse_what_does_not_fit() {
    let w = vec![0u8; 2 * 20];
    assert!(PackedRows::new(SimdLevel::Scalar, GgmlType::Q4_1, &w, 2, 32, |_| {}).is_err());
    for level in levels() {
        packed_rows_refuse_at(level, &w);
    }
}

fn packed_rows_refuse_at(level: SimdLevel, w: &[u8]) {
    assert!(PackedRows::new(level, GgmlType::Q5_K, w, 2, 32, |_| {}).is_err());
    assert!(PackedRows::new(level, GgmlType::Q4_1, &w[..39], 2, 32, |_| {}).is_err());
    assert!(PackedRows::new(level, GgmlType::Q4_1, w, 2, 48, |_| {}).is_err());
    let packed = PackedRows::new(level, GgmlType::Q4_1, w, 2, 32, |_| {}).expect("pack");
    let mut out = vec![0f32; 8];
    let x = vec![0f32; 64];
    let call = |acts: &Q16Acts, groups: std::ops::Range<usize>, stride: usize| {
        let mut out = out.clone();
        // SAFETY: out holds 8 values, enough for 2 columns of stride <= 4 (and a refused
        // call writes nothing).
        unsafe { matmul_packed_to(level, &packed, groups, acts, out.as_mut_ptr(), stride) }
    };
    let acts = quantize(GgmlType::Q4_1, &x, 32, 2).expect("quantize");
    assert!(call(&acts, 0..1, 2).is_ok());
    assert!(call(&acts, 0..2, 2).is_err(), "one group only");
    assert!(call(&acts, 0..1, 1).is_err(), "stride under the rows");
    let wide = quantize(GgmlType::Q4_1, &x, 64, 1).expect("quantize");
    assert!(call(&wide, 0..1, 2).is_err(), "other width");
    let q8 = quantize(GgmlType::Q8_0, &x, 32, 2).expect("quantize");
    assert!(call(&q8, 0..1, 2).is_err(), "other type");
    // SAFETY: out holds 8 values, enough for 2 columns of stride 2.
    let scalar =
        unsafe { matmul_packed_to(SimdLevel::Scalar, &packed, 0..1, &acts, out.as_mut_ptr(), 2) };
    assert!(scalar.is_err(), "a level without the kernels");
}

/// A matrix of more than one [`PACK_SPAN`] is packed in spans that cover its rows once, in
/// order, on whole groups, and multiplies with the bits of its raw rows.
#[test]
fn packing_reports_each_span_of_rows_once() {
    for level in levels() {
        packing_reports_spans_at(level);
    }
}

fn packing_reports_spans_at(level: SimdLevel) {
    let mut rng = Rng(23);
    let (ty, k) = (GgmlType::Q8_0, 64);
    let rb = ty.row_bytes(k as u64).expect("whole blocks") as usize;
    let nr = 2 * PACK_SPAN / rb + 7;
    let w = weights(&mut rng, ty, nr, k);
    let mut spans = Vec::new();
    let packed = PackedRows::new(level, ty, &w, nr, k, |s| {
        spans.push((s.as_ptr() as usize - w.as_ptr() as usize, s.len()));
    })
    .expect("pack");
    assert!(spans.len() >= 3, "{} spans", spans.len());
    let mut next = 0;
    for &(offset, len) in &spans {
        assert_eq!(offset, next, "spans in order, without gaps");
        assert!(
            len <= PACK_SPAN && offset % (GROUP_ROWS * rb) == 0,
            "{offset} {len}"
        );
        next += len;
    }
    assert_eq!(next, w.len(), "every row reported");
    let x: Vec<f32> = (0..2 * k).map(|_| rng.f32()).collect();
    let acts = quantize(ty, &x, k, 2).expect("quantize");
    let (mut raw, mut got) = (vec![0f32; 2 * nr], vec![f32::NAN; 2 * nr]);
    matmul(level, &w, nr, &acts, &mut raw, nr).expect("matmul");
    // SAFETY: got holds 2 columns of nr rows.
    unsafe {
        matmul_packed_to(
            level,
            &packed,
            0..packed.groups(),
            &acts,
            got.as_mut_ptr(),
            nr,
        )
    }
    .expect("matmul");
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert!(bits(&raw) == bits(&got), "packed and raw rows differ");
}

/// A reused buffer holds exactly what a fresh quantization does, whichever shapes and types
/// it held before (larger, smaller, the other type).
#[test]
fn a_reused_buffer_quantizes_like_a_fresh_one() {
    let mut rng = Rng(31);
    let mut acts = Q16Acts::empty();
    for (ty, k, n) in [
        (GgmlType::Q4_1, 96, 17),
        (GgmlType::Q8_0, 64, 3),
        (GgmlType::Q4_1, 32, 1),
        (GgmlType::Q8_0, 160, 9),
    ] {
        let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
        acts.quantize(ty, &x, k, n).expect("quantize");
        let fresh = quantize(ty, &x, k, n).expect("quantize");
        assert_eq!((acts.ty, acts.k, acts.n), (fresh.ty, fresh.k, fresh.n));
        assert_eq!(words(&acts), words(&fresh), "{ty} {k} {n}");
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&acts.scale), bits(&fresh.scale));
        assert_eq!(bits(&acts.sum), bits(&fresh.sum));
    }
    assert!(acts.quantize(GgmlType::Q5_K, &[0.0; 32], 32, 1).is_err());
}

/// Split into fills run in any order (last first here, as another thread might), the
/// quantization holds exactly the bits of one pass, for part counts that do and do not
/// divide the blocks and split tiles mid-way.
#[test]
fn fills_in_any_order_quantize_like_one_pass() {
    let mut rng = Rng(37);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (ty, k, n) in [
        (GgmlType::Q4_1, 576, 16),
        (GgmlType::Q8_0, 96, 9),
        (GgmlType::Q4_1, 64, 3),
        (GgmlType::Q8_0, 32, 1),
    ] {
        let x: Vec<f32> = (0..n * k).map(|_| rng.f32()).collect();
        for (parts, layout) in [2, 3, 5, 64, 1000]
            .into_iter()
            .flat_map(|p| [Layout::Pairs, Layout::Bytes].map(|l| (p, l)))
        {
            let whole = quantize_as(ty, &x, k, n, layout);
            let mut acts = Q16Acts::empty();
            let mut fills: Vec<Q16Fill<'_>> = acts
                .fills_as(ty, &x, k, n, parts, layout)
                .expect("fills")
                .collect();
            assert!(fills.len() <= parts);
            while let Some(fill) = fills.pop() {
                fill.run();
            }
            let what = format!("{ty} k {k} n {n} in {parts} parts, {layout:?}");
            assert_eq!(words(&acts), words(&whole), "{what}");
            assert_eq!(bits(&acts.scale), bits(&whole.scale), "{what}");
            assert_eq!(bits(&acts.sum), bits(&whole.sum), "{what}");
        }
    }
}

/// Both levels read one packed layout (a matrix packed at one level multiplies at the
/// other), so they must pack the same bytes.
#[test]
fn both_levels_pack_the_same_bytes() {
    let levels = levels();
    if levels.len() < 2 {
        println!("skipped: only {levels:?} here, nothing to compare");
        return;
    }
    let mut rng = Rng(0x5eed);
    for ty in TYPES
        .into_iter()
        .filter(|&t| levels.iter().all(|&l| applies(l, t)))
    {
        let (nr, k) = (37, width(ty, 96));
        let w = weights(&mut rng, ty, nr, k);
        let packs: Vec<PackedRows> = levels
            .iter()
            .map(|&l| PackedRows::new(l, ty, &w, nr, k, |_| {}).expect("pack"))
            .collect();
        let bytes = |p: &PackedRows| p.lines.iter().flat_map(|l| l.0).collect::<Vec<u8>>();
        assert!(
            bytes(&packs[0]) == bytes(&packs[1]),
            "{ty}: packed bytes differ"
        );
    }
}
