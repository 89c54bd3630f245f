//! The MMQ prefill products (mmq.cu): every format in one and two activation planes, on
//! the matvec boundary shapes and token counts below, at and past the 64-token tile.
//!
//! Oracle: the f64 product of the dequantized weights with the very activations the kernel
//! read, `d·(q + q2/256)` per block (the quantizer is checked bit for bit in
//! `kernels_i8.rs`; here its output must equal that definition again, over a whole chunk of
//! token rows quantized as one vector). The kernel computes exactly that up to f32 rounding
//! of the per-block scaling and the sums, so each output must be within 1e-5 of Σ|w·x| of
//! its row (the scale of those roundings; relative to the result itself a row whose terms
//! cancel would demand more than f32 holds). Column splits (small grids) and single launches
//! (one stage of columns) both occur among the shapes.

use crate::backend;
use crate::kernels::quantized;
use crate::kernels_i8::{TYPES_I8, activations, naive_matvec64, quantize_ref};

/// Token counts: one, a partial tile, and past one full tile of 64.
const TOKENS: [usize; 3] = [1, 9, 70];

#[test]
fn mmq_matches_product_with_the_rounded_activations() {
    let Some(b) = backend() else { return };
    for planes in [1, 2] {
        for ty in TYPES_I8 {
            for (rows, cols) in crate::kernels::shapes(ty) {
                let (q, deq) = quantized(ty, rows, cols, (rows * 29 + cols) as u64);
                let absw: Vec<f32> = deq.iter().map(|w| w.abs()).collect();
                for n in TOKENS {
                    let what = format!("mmq int8x{planes} {ty} {rows}x{cols}, {n} tokens");
                    let x = activations(n * cols, (n * 7 + cols) as u64);
                    let (got, qa) = b.matmul_mmq_host(ty, planes, &q, rows, cols, &x).unwrap();
                    assert_eq!(qa, quantize_ref(&x, planes), "{what}: quantized x");
                    let xr = qa.values();
                    let mut worst = 0.0f64;
                    for t in 0..n {
                        let xt = &xr[t * cols..(t + 1) * cols];
                        let want = naive_matvec64(&deq, rows, cols, xt);
                        let abs: Vec<f64> = xt.iter().map(|v| v.abs()).collect();
                        let mag = naive_matvec64(&absw, rows, cols, &abs);
                        for r in 0..rows {
                            let g = got[t * rows + r];
                            let e = (f64::from(g) - want[r]).abs() / mag[r].max(1e-30);
                            assert!(
                                g.is_finite() && e <= 1e-5,
                                "{what}: token {t} row {r}: {g} vs {}, |Δ| {e:.2e} of Σ|w·x|",
                                want[r]
                            );
                            worst = worst.max(e);
                        }
                    }
                    if rows >= 130 && n == 70 {
                        println!("{what}: worst |Δ| / Σ|w·x| vs the rounded-x product {worst:.2e}");
                    }
                }
            }
        }
    }
    let counts = b.launch_counts();
    for s in ["q4_1", "q8_0", "q4_k", "q6_k"] {
        for k in [format!("mmq_i8_{s}"), format!("mmq_i8x2_{s}")] {
            assert!(counts[k.as_str()] > 0, "{k} never ran");
        }
    }
}
