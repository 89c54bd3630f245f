//! quantize -> dequantize error on random data, relative to the input RMS.
//!
//! Bounds: for round-to-nearest with step D the error RMS is about D / sqrt(12). On roughly
//! Gaussian data (sum of 4 uniforms) D is (range of a block) / (levels - 1); the bounds
//! below are about 1.5x the values measured when they were set (printed each run), and the measured values are printed.
//! A wrong bit layout in quantize gives errors of order 1, far above every bound.

use ferrite_quant::{GgmlType, dequantize, quantize, supports_quantize};
use ferrite_testkit::XorShift as Rng;

/// Roughly Gaussian, mean 0.
fn gauss(rng: &mut Rng) -> f32 {
    rng.f32() + rng.f32() + rng.f32() + rng.f32()
}

#[test]
fn round_trip_error_is_within_format_bounds() {
    let bounds: [(GgmlType, f64); 12] = [
        (GgmlType::F32, 0.0),
        (GgmlType::F16, 3e-4),
        (GgmlType::BF16, 2.6e-3),
        (GgmlType::Q8_0, 0.0075),
        (GgmlType::Q8_K, 0.009),
        (GgmlType::Q6_K, 0.027),
        (GgmlType::Q5_0, 0.06),
        (GgmlType::Q5_1, 0.055),
        (GgmlType::Q5_K, 0.055),
        (GgmlType::Q4_0, 0.12),
        (GgmlType::Q4_1, 0.11),
        (GgmlType::Q4_K, 0.11),
    ];
    let mut rng = Rng(99);
    let n = 256 * 64;
    let x: Vec<f32> = (0..n).map(|_| gauss(&mut rng)).collect();
    let rms = (x.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / n as f64).sqrt();
    for (ty, bound) in bounds {
        assert!(supports_quantize(ty), "{ty}");
        let mut q = vec![0u8; ty.row_bytes(n as u64).expect("whole blocks") as usize];
        quantize(ty, &x, &mut q).expect("quantize");
        let mut back = vec![0f32; n];
        dequantize(ty, &q, &mut back).expect("dequantize");
        let mse = x
            .iter()
            .zip(&back)
            .map(|(a, b)| f64::from(a - b).powi(2))
            .sum::<f64>();
        let rel = (mse / n as f64).sqrt() / rms;
        println!("round trip {ty}: rmse / rms = {rel:.4} (bound {bound})");
        assert!(rel <= bound, "{ty}: relative RMSE {rel} above {bound}");
    }
}

#[test]
fn zero_and_constant_blocks_survive() {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
    ] {
        let n = 256;
        for fill in [0.0f32, 0.75, -2.0] {
            let x = vec![fill; n];
            let mut q = vec![0u8; ty.row_bytes(n as u64).expect("whole blocks") as usize];
            quantize(ty, &x, &mut q).expect("quantize");
            let mut back = vec![0f32; n];
            dequantize(ty, &q, &mut back).expect("dequantize");
            for v in &back {
                assert!(
                    v.is_finite() && (v - fill).abs() <= 0.02 * fill.abs() + 1e-6,
                    "{ty} fill {fill}: got {v}"
                );
            }
        }
    }
}

#[test]
fn bad_lengths_are_errors() {
    let mut out = [0f32; 31];
    assert!(dequantize(GgmlType::Q4_0, &[0u8; 18], &mut out).is_err());
    let mut out = [0f32; 32];
    assert!(dequantize(GgmlType::Q4_0, &[0u8; 17], &mut out).is_err());
    assert!(dequantize(GgmlType::IQ2_XXS, &[0u8; 66], &mut [0f32; 256]).is_err());
    assert!(quantize(GgmlType::Q2_K, &[0f32; 256], &mut [0u8; 84]).is_err());
    assert!(quantize(GgmlType::Q8_0, &[0f32; 32], &mut [0u8; 33]).is_err());
}
