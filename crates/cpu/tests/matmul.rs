//! matmul against a naive f64 reference, and determinism across thread counts and levels.
//!
//! Oracle: weights dequantized by the scalar reference path (itself pinned to the gguf-py
//! fixtures), then plain f64 loops. Bound: |y - ref| <= 1e-5 * sum_k |w_k x_k| + 1e-30,
//! about 80 f32 ulps of the absolute sum; f32 accumulation over <= 1536 terms stays well
//! inside it (observed errors are printed).

use ferrite_cpu::{Matrix, ThreadPool, matmul, matmul_shared, matmul_with, pack};
use ferrite_gguf::GgmlType;
use ferrite_quant::{SimdLevel, dequantize_ref, quantize};
use ferrite_testkit::XorShift as Rng;

const TYPES: [GgmlType; 11] = [
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
];

fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let vals: Vec<f32> = (0..rows * cols).map(|_| rng.f32()).collect();
    let mut data = vec![0u8; rows * ty.row_bytes(cols as u64).expect("whole blocks") as usize];
    quantize(ty, &vals, &mut data).expect("quantize");
    data
}

/// Random matrices of the `(type, rows)` in `set`, `cols` values per row.
fn random_set(rng: &mut Rng, set: &[(GgmlType, usize)], cols: usize) -> Vec<Vec<u8>> {
    set.iter()
        .map(|&(ty, rows)| random_matrix(rng, ty, rows, cols))
        .collect()
}

/// Unpacked views of `data`, the matrices of `set`.
fn matrices<'a>(set: &[(GgmlType, usize)], cols: usize, data: &'a [Vec<u8>]) -> Vec<Matrix<'a>> {
    set.iter()
        .zip(data)
        .map(|(&(ty, rows), d)| Matrix {
            ty,
            rows,
            cols,
            data: d,
            packed: None,
        })
        .collect()
}

/// (rows, cols in blocks of 256 or 32, tokens): 1 x K, K = 32 * odd, rows not divisible by
/// the thread counts, 1/3/17 tokens.
fn shapes(ty: GgmlType) -> Vec<(usize, usize, usize)> {
    let b = ty.block_size().max(32) as usize;
    vec![
        (1, b, 1),
        (7, 3 * b, 3),
        (13, 5 * b, 17),
        (5, b, 1),
        (33, 2 * b, 3),
        (11, 3 * b, 17),
    ]
}

#[test]
fn matmul_matches_f64_reference_at_every_level() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let pool = ThreadPool::new(3).expect("pool");
    for level in SimdLevel::ALL {
        if !level.is_available() {
            println!("skipped: level {level} not available on this CPU");
            continue;
        }
        for ty in TYPES {
            let mut worst = 0f64;
            for (rows, cols, nt) in shapes(ty) {
                let data = random_matrix(&mut rng, ty, rows, cols);
                let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32()).collect();
                let mut wf = vec![0f32; rows * cols];
                dequantize_ref(ty, &data, &mut wf).expect("dequantize");
                let m = Matrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                    packed: None,
                };
                let mut y = vec![f32::NAN; rows * nt];
                matmul_with(&pool, level, m, &x, nt, &mut y).expect("matmul");
                for t in 0..nt {
                    for r in 0..rows {
                        let (mut s, mut a) = (0f64, 0f64);
                        for k in 0..cols {
                            let p = f64::from(wf[r * cols + k]) * f64::from(x[t * cols + k]);
                            s += p;
                            a += p.abs();
                        }
                        let got = f64::from(y[t * rows + r]);
                        assert!(got.is_finite(), "{ty} {level}: non-finite output");
                        let err = (got - s).abs();
                        assert!(
                            err <= 1e-5 * a + 1e-30,
                            "{ty} {level} {rows}x{cols} t={t} r={r}: {got} vs {s} (sum|wx| {a})"
                        );
                        worst = worst.max(err / a.max(1e-30));
                    }
                }
            }
            println!("matmul {ty} [{level}]: max |err| / sum|wx| = {worst:.2e}");
        }
    }
}

#[test]
fn thread_counts_give_identical_bits() {
    let mut rng = Rng(42);
    let pools: Vec<ThreadPool> = (1..=3).map(|n| ThreadPool::new(n).expect("pool")).collect();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q4_K,
            GgmlType::F32,
            GgmlType::Q8_0,
            GgmlType::Q5_0,
            GgmlType::Q6_K,
        ] {
            let b = ty.block_size().max(32) as usize;
            for (rows, cols, nt) in [(37, 3 * b, 1), (37, 3 * b, 17), (2, b, 3)] {
                let data = random_matrix(&mut rng, ty, rows, cols);
                let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32()).collect();
                let m = Matrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                    packed: None,
                };
                let outs: Vec<Vec<u32>> = pools
                    .iter()
                    .map(|p| {
                        let mut y = vec![0f32; rows * nt];
                        matmul_with(p, level, m, &x, nt, &mut y).expect("matmul");
                        y.iter().map(|v| v.to_bits()).collect()
                    })
                    .collect();
                assert_eq!(outs[0], outs[1], "{ty} {level} 1 vs 2 threads");
                assert_eq!(outs[0], outs[2], "{ty} {level} 1 vs 3 threads");
                // A token's outputs do not depend on the rest of the batch.
                if nt > 1 {
                    let mut y1 = vec![0f32; rows];
                    matmul_with(&pools[1], level, m, &x[cols..2 * cols], 1, &mut y1)
                        .expect("matmul");
                    let row1: Vec<u32> = y1.iter().map(|v| v.to_bits()).collect();
                    assert_eq!(&outs[0][rows..2 * rows], &row1[..], "{ty} {level} batch");
                }
            }
        }
        println!("deterministic across 1/2/3 threads and batch sizes [{level}]");
    }
}

/// Several matrices of one input in one call give each output the bits of its own
/// `matmul`, whether the call shares one pass (one type with 16-bit products) or falls back to one
/// call each (mixed types, other formats), for thread counts that split the rows of all the
/// matrices unevenly and across matrix boundaries.
#[test]
fn shared_input_products_equal_separate_ones() {
    let mut rng = Rng(7);
    let pools: Vec<ThreadPool> = (1..=3).map(|n| ThreadPool::new(n).expect("pool")).collect();
    let cols = 96;
    let sets: [&[(GgmlType, usize)]; 6] = [
        &[
            (GgmlType::Q4_1, 48),
            (GgmlType::Q4_1, 16),
            (GgmlType::Q4_1, 17),
        ],
        &[(GgmlType::Q8_0, 5), (GgmlType::Q8_0, 40)],
        &[(GgmlType::Q4_1, 20), (GgmlType::Q8_0, 9)],
        &[(GgmlType::Q4_K, 8), (GgmlType::F32, 3)],
        // One pass on AVX2 (16-bit products there), one call each elsewhere.
        &[(GgmlType::Q4_K, 20), (GgmlType::Q4_K, 9)],
        &[(GgmlType::Q5_0, 33), (GgmlType::Q5_0, 16)],
    ];
    for set in sets {
        let cols = if set.iter().any(|(t, _)| t.block_size() == 256) {
            256
        } else {
            cols
        };
        let data = random_set(&mut rng, set, cols);
        let ms = matrices(set, cols, &data);
        for nt in [1, 3, 16] {
            let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32()).collect();
            for pool in &pools {
                let mut ys: Vec<Vec<f32>> =
                    ms.iter().map(|m| vec![f32::NAN; m.rows * nt]).collect();
                let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
                matmul_shared(pool, &ms, &x, nt, &mut outs).expect("shared");
                for (m, y) in ms.iter().zip(&ys) {
                    let mut want = vec![0f32; m.rows * nt];
                    matmul(pool, *m, &x, nt, &mut want).expect("matmul");
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(
                        bits(y),
                        bits(&want),
                        "{set:?} {nt} tokens {} threads",
                        pool.n_threads()
                    );
                }
            }
        }
    }
    // One output per matrix, each of its matrix's size.
    let data = random_matrix(&mut rng, GgmlType::Q4_1, 4, 32);
    let m = Matrix {
        ty: GgmlType::Q4_1,
        rows: 4,
        cols: 32,
        data: &data,
        packed: None,
    };
    let x = vec![0.5f32; 32];
    let (mut a, mut b) = (vec![0f32; 4], vec![0f32; 3]);
    assert!(matmul_shared(&pools[1], &[m, m], &x, 1, &mut [&mut a]).is_err());
    assert!(matmul_shared(&pools[1], &[m, m], &x, 1, &mut [&mut a, &mut b]).is_err());
}

/// Rows packed once ([`pack`]) give every product the bits of the raw rows, alone and
/// shared, for thread counts that split the row groups unevenly and across matrices; packed
/// rows of another matrix are refused; formats without 16-bit products are not packed.
#[test]
fn packed_rows_give_the_bits_of_raw_rows() {
    let mut rng = Rng(11);
    let pools: Vec<ThreadPool> = (1..=3).map(|n| ThreadPool::new(n).expect("pool")).collect();
    // Q5_K has 16-bit products at no level.
    let q5k = random_matrix(&mut rng, GgmlType::Q5_K, 4, 256);
    let q5k = Matrix {
        ty: GgmlType::Q5_K,
        rows: 4,
        cols: 256,
        data: &q5k,
        packed: None,
    };
    assert!(pack(q5k, |_| {}).expect("pack").is_none());
    // Q5_0, Q4_K and Q6_K have them on AVX2 only (packed widened, `q16::PackedRows`).
    for (set, cols) in [
        (
            &[
                (GgmlType::Q4_1, 48),
                (GgmlType::Q4_1, 17),
                (GgmlType::Q4_1, 5),
            ][..],
            96,
        ),
        (&[(GgmlType::Q8_0, 37), (GgmlType::Q8_0, 16)][..], 96),
        (&[(GgmlType::Q5_0, 37), (GgmlType::Q5_0, 16)][..], 96),
        (&[(GgmlType::Q4_K, 33), (GgmlType::Q6_K, 17)][..], 512),
    ] {
        let data = random_set(&mut rng, set, cols);
        let raw = matrices(set, cols, &data);
        let packs: Vec<_> = raw
            .iter()
            .map(|m| pack(*m, |_| {}).expect("pack"))
            .collect();
        if packs.iter().any(Option::is_none) {
            println!("skipped: {set:?}: no 16-bit products for these types on this CPU");
            continue;
        }
        let packed: Vec<Matrix<'_>> = raw
            .iter()
            .zip(&packs)
            .map(|(m, p)| Matrix {
                packed: p.as_ref(),
                ..*m
            })
            .collect();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for nt in [1, 3, 16] {
            let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32()).collect();
            for pool in &pools {
                let run = |ms: &[Matrix<'_>]| {
                    let mut ys: Vec<Vec<f32>> =
                        ms.iter().map(|m| vec![f32::NAN; m.rows * nt]).collect();
                    let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
                    matmul_shared(pool, ms, &x, nt, &mut outs).expect("shared");
                    for (m, y) in ms.iter().zip(&mut ys) {
                        let mut alone = vec![f32::NAN; m.rows * nt];
                        matmul(pool, *m, &x, nt, &mut alone).expect("matmul");
                        assert_eq!(bits(&alone), bits(y), "alone and shared");
                    }
                    ys
                };
                let (want, got) = (run(&raw), run(&packed));
                for (w, g) in want.iter().zip(&got) {
                    assert_eq!(
                        bits(w),
                        bits(g),
                        "{set:?} {nt} tokens {} threads",
                        pool.n_threads()
                    );
                }
            }
        }
        let other = Matrix {
            packed: packed[1].packed,
            ..raw[0]
        };
        let x = vec![0.5f32; cols];
        let mut y = vec![0f32; other.rows];
        assert!(matmul(&pools[1], other, &x, 1, &mut y).is_err());
    }
}

/// A decode batch (2..=17 tokens: the multi-column matvec; 33: the tile GEMM) gives each
/// token exactly the bits of multiplying it alone, for row counts that split unevenly over
/// the threads, the kernel's row pairs and the 64-row output groups.
#[test]
fn decode_batches_equal_single_token_products() {
    let mut rng = Rng(7);
    let pools: Vec<ThreadPool> = (1..=3).map(|n| ThreadPool::new(n).expect("pool")).collect();
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_0,
            GgmlType::Q6_K,
            GgmlType::F32,
        ] {
            let b = ty.block_size().max(32) as usize;
            for (rows, cols) in [(37, b), (131, 3 * b)] {
                let data = random_matrix(&mut rng, ty, rows, cols);
                let m = Matrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                    packed: None,
                };
                for nt in [2, 3, 4, 5, 7, 8, 16, 17, 33] {
                    let x: Vec<f32> = (0..nt * cols).map(|_| rng.f32()).collect();
                    let mut alone = vec![0f32; nt * rows];
                    for (xt, yt) in x.chunks_exact(cols).zip(alone.chunks_exact_mut(rows)) {
                        matmul_with(&pools[0], level, m, xt, 1, yt).expect("matmul");
                    }
                    for p in &pools {
                        let mut y = vec![f32::NAN; nt * rows];
                        matmul_with(p, level, m, &x, nt, &mut y).expect("matmul");
                        for (i, (a, b)) in y.iter().zip(&alone).enumerate() {
                            assert_eq!(
                                a.to_bits(),
                                b.to_bits(),
                                "{ty} {level} {rows}x{cols} n={nt} threads={} token {} row {}",
                                p.n_threads(),
                                i / rows,
                                i % rows
                            );
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn shape_errors_are_reported_not_panicked() {
    let pool = ThreadPool::new(2).expect("pool");
    let data = vec![0u8; 18];
    let m = Matrix {
        ty: GgmlType::Q4_0,
        rows: 1,
        cols: 32,
        data: &data,
        packed: None,
    };
    let mut y = [0f32; 1];
    assert!(matmul_with(&pool, SimdLevel::Scalar, m, &[0.0; 31], 1, &mut y).is_err());
    let bad = Matrix {
        ty: GgmlType::Q4_0,
        rows: 2,
        cols: 32,
        data: &data,
        packed: None,
    };
    assert!(matmul_with(&pool, SimdLevel::Scalar, bad, &[0.0; 32], 1, &mut [0.0; 2]).is_err());
    let partial = Matrix {
        ty: GgmlType::Q4_0,
        rows: 1,
        cols: 31,
        data: &data,
        packed: None,
    };
    assert!(matmul_with(&pool, SimdLevel::Scalar, partial, &[0.0; 31], 1, &mut y).is_err());
    let iq = Matrix {
        ty: GgmlType::IQ2_XXS,
        rows: 1,
        cols: 256,
        data: &[0u8; 66],
        packed: None,
    };
    assert!(matmul_with(&pool, SimdLevel::Scalar, iq, &[0.0; 256], 1, &mut y).is_err());
}
