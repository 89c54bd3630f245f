//! AVX-512 kernels (512-bit, 16 f32 lanes; F/BW/VL plus AVX2/FMA/F16C).
//!
//! Canonical order at this level: one `__m512` accumulator per output, `acc = fma(w, x, acc)`
//! over consecutive 16-value chunks, reduced by [`hsum`], then the `k % 16` tail products
//! added one at a time.

use std::arch::x86_64::*;

use super::{DequantFn, ElemKind, Q8Block, RowElem, tail};
use ferrite_gguf::GgmlType;

/// The fixed horizontal reduction: 512 -> 256 -> 128 bits by halves, then pairs, then the
/// last two lanes.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn hsum(v: __m512) -> f32 {
    let lo = _mm512_castps512_ps256(v);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let s = _mm256_add_ps(lo, hi);
    let lo = _mm256_castps256_ps128(s);
    let hi = _mm256_extractf128_ps::<1>(s);
    let s = _mm_add_ps(lo, hi);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps::<1>(s, s));
    _mm_cvtss_f32(s)
}

/// Values `at..at + 16` of the row at `row` as f32 lanes (narrow rows widened exactly).
///
/// # Safety
/// AVX-512 available; the row holds values `at..at + 16`, and for blocks `at` is a multiple
/// of 16 (the values lie in one block).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn load16<X: RowElem>(row: *const X, at: usize) -> __m512 {
    // SAFETY: the values lie in the row (caller contract); RowElem is sealed to f32, f16 and
    // Q8Block, whose layouts KIND names.
    unsafe {
        let p = row.add(at / X::VALUES);
        match X::KIND {
            ElemKind::F32 => _mm512_loadu_ps(p.cast()),
            ElemKind::F16 => _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
            ElemKind::Q8 => {
                let b = p.cast::<Q8Block>();
                let q = (&raw const (*b).q).cast::<i8>().add(at % 32);
                let q = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(q.cast())));
                _mm512_mul_ps(_mm512_set1_ps((*b).d), q)
            }
        }
    }
}

/// Dot product of the first `k` values.
///
/// # Safety
/// The CPU must support the AVX-512 set above, and `k <= w.len().min(x.len())`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn dot(w: &[f32], x: &[f32], k: usize) -> f32 {
    let n16 = k / 16;
    let mut acc = _mm512_setzero_ps();
    for c in 0..n16 {
        // SAFETY: 16 * c + 16 <= k <= len of both slices (caller contract).
        unsafe {
            let a = _mm512_loadu_ps(w.as_ptr().add(16 * c));
            let b = _mm512_loadu_ps(x.as_ptr().add(16 * c));
            acc = _mm512_fmadd_ps(a, b, acc);
        }
    }
    tail(hsum(acc), w, x, 16 * n16, k)
}

/// `y[i] = fma(a, x[i], y[i])` over the first `k` values; the tail uses `mul_add` so every
/// element is rounded once, as in the vector body.
///
/// # Safety
/// The CPU has the features this function enables; `k` is within both slices.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn axpy(a: f32, x: &[f32], y: &mut [f32], k: usize) {
    let n = k / 16;
    let av = _mm512_set1_ps(a);
    for c in 0..n {
        // SAFETY: 16 * c + 16 <= k <= len of both slices (caller contract).
        unsafe {
            let xv = _mm512_loadu_ps(x.as_ptr().add(16 * c));
            let yv = _mm512_loadu_ps(y.as_ptr().add(16 * c));
            _mm512_storeu_ps(y.as_mut_ptr().add(16 * c), _mm512_fmadd_ps(av, xv, yv));
        }
    }
    for i in 16 * n..k {
        y[i] = a.mul_add(x[i], y[i]);
    }
}

/// Register-blocked `R x T` products (see [`tile`]).
///
/// # Safety
/// AVX-512 available; `w.len() == R`, `x.len() == T`, every row has `k` values and `out`
/// has `R * T` slots.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn micro<const R: usize, const T: usize, X: RowElem>(
    w: &[&[f32]],
    x: &[&[X]],
    k: usize,
    out: &mut [f32],
) {
    let n16 = k / 16;
    let mut acc = [[_mm512_setzero_ps(); T]; R];
    for c in 0..n16 {
        let mut xv = [_mm512_setzero_ps(); T];
        for t in 0..T {
            // SAFETY: 16 * c + 16 <= k, within x[t] (caller contract).
            xv[t] = unsafe { load16(x[t].as_ptr(), 16 * c) };
        }
        for r in 0..R {
            // SAFETY: 16 * c + 16 <= k <= w[r].len() (caller contract).
            let wv = unsafe { _mm512_loadu_ps(w[r].as_ptr().add(16 * c)) };
            for t in 0..T {
                acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
            }
        }
    }
    // Small tiles (decode attention's 1 x 4) reduce faster one by one.
    let sums: [f32; 16] = if R * T >= 8 {
        let mut flat = [_mm512_setzero_ps(); 16];
        for r in 0..R {
            for t in 0..T {
                flat[r * T + t] = acc[r][t];
            }
        }
        hsum16(&flat)
    } else {
        std::array::from_fn(|o| {
            if o < R * T {
                hsum(acc[o / T][o % T])
            } else {
                0.0
            }
        })
    };
    for r in 0..R {
        for t in 0..T {
            out[r * T + t] = tail(sums[r * T + t], w[r], x[t], 16 * n16, k);
        }
    }
}

/// [`hsum`] of 16 vectors at once, bit-identical per vector: the same pairwise additions
/// (lane `i` + lane `i + 8`, then `+ 4`, then `+ 2`, then `+ 1`), done on transposed
/// vectors so that 15 additions and 30 shuffles replace 16 separate reductions (the
/// reductions were a fifth of a 4 x 4 tile at k = 640).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) fn hsum16(v: &[__m512; 16]) -> [f32; 16] {
    // Step 1: u[m] = [v[2m] lo256 + hi256, v[2m+1] lo256 + hi256].
    let u: [__m512; 8] = std::array::from_fn(|m| {
        let (a, b) = (v[2 * m], v[2 * m + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x44>(a, b),
            _mm512_shuffle_f32x4::<0xEE>(a, b),
        )
    });
    // Step 2: w[i] holds outputs 4i..4i+4, one per 128-bit lane, four partials each.
    let w: [__m512; 4] = std::array::from_fn(|i| {
        let (a, b) = (u[2 * i], u[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_f32x4::<0x88>(a, b),
            _mm512_shuffle_f32x4::<0xDD>(a, b),
        )
    });
    // Step 3: partials p0 + p2 and p1 + p3, two outputs per 128-bit lane per vector.
    let s: [__m512; 2] = std::array::from_fn(|i| {
        let (a, b) = (w[2 * i], w[2 * i + 1]);
        _mm512_add_ps(
            _mm512_shuffle_ps::<0x44>(a, b),
            _mm512_shuffle_ps::<0xEE>(a, b),
        )
    });
    // Step 4: (p0 + p2) + (p1 + p3); lane 4l + i now holds output 4i + l.
    let r = _mm512_add_ps(
        _mm512_shuffle_ps::<0x88>(s[0], s[1]),
        _mm512_shuffle_ps::<0xDD>(s[0], s[1]),
    );
    let mut lanes = [0f32; 16];
    // SAFETY: lanes holds 16 values.
    unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), r) };
    std::array::from_fn(|o| lanes[4 * (o % 4) + o / 4])
}

/// `out[i * x.len() + j] = dot(w[i], x[j])` for up to 4 x 4 rows (32 zmm registers hold the
/// 16 accumulators and the loads).
///
/// # Safety
/// AVX-512 available; 1..=4 rows each side, all with at least `k` values; `out` has
/// `w.len() * x.len()` slots.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn tile<X: RowElem>(w: &[&[f32]], x: &[&[X]], k: usize, out: &mut [f32]) {
    macro_rules! go {
        ($($r:literal, $t:literal);*) => {
            match (w.len(), x.len()) {
                // SAFETY: forwarded caller contract; R and T match the slice lengths.
                $(($r, $t) => unsafe { micro::<$r, $t, X>(w, x, k, out) },)*
                _ => {}
            }
        };
    }
    go!(1,1; 1,2; 1,3; 1,4; 2,1; 2,2; 2,3; 2,4; 3,1; 3,2; 3,3; 3,4; 4,1; 4,2; 4,3; 4,4);
}

/// Adds `w * x` (equal lengths, a multiple of 16) into 16 stored accumulator lanes.
///
/// # Safety
/// AVX-512 available; `w.len() == x.len()`, a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn acc_lanes(lanes: &mut [f32; 16], w: &[f32], x: &[f32]) {
    // SAFETY: lanes has 16 values; chunk bounds follow from the caller contract.
    unsafe {
        let mut acc = _mm512_loadu_ps(lanes.as_ptr());
        for c in 0..w.len() / 16 {
            let a = _mm512_loadu_ps(w.as_ptr().add(16 * c));
            let b = _mm512_loadu_ps(x.as_ptr().add(16 * c));
            acc = _mm512_fmadd_ps(a, b, acc);
        }
        _mm512_storeu_ps(lanes.as_mut_ptr(), acc);
    }
}

/// Four rows at once: adds `w[r] * x` into the stored lanes of row `r` (all lengths equal,
/// a multiple of 16), interleaving the four FMA chains. Same per-row order as
/// [`acc_lanes`].
///
/// # Safety
/// AVX-512 available; every `w[r]` and `x` have the same length, a multiple of 16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn acc_lanes4(lanes: &mut [[f32; 16]; 4], w: [&[f32]; 4], x: &[f32]) {
    // SAFETY: each lane array has 16 >= 16 values; chunk bounds follow from the contract.
    unsafe {
        let mut a0 = _mm512_loadu_ps(lanes[0].as_ptr());
        let mut a1 = _mm512_loadu_ps(lanes[1].as_ptr());
        let mut a2 = _mm512_loadu_ps(lanes[2].as_ptr());
        let mut a3 = _mm512_loadu_ps(lanes[3].as_ptr());
        for c in 0..x.len() / 16 {
            let xv = _mm512_loadu_ps(x.as_ptr().add(16 * c));
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(w[0].as_ptr().add(16 * c)), xv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(w[1].as_ptr().add(16 * c)), xv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(w[2].as_ptr().add(16 * c)), xv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(w[3].as_ptr().add(16 * c)), xv, a3);
        }
        _mm512_storeu_ps(lanes[0].as_mut_ptr(), a0);
        _mm512_storeu_ps(lanes[1].as_mut_ptr(), a1);
        _mm512_storeu_ps(lanes[2].as_mut_ptr(), a2);
        _mm512_storeu_ps(lanes[3].as_mut_ptr(), a3);
    }
}

/// [`hsum`] of 16 stored lanes.
///
/// # Safety
/// AVX-512 available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
pub(crate) unsafe fn reduce_lanes(lanes: &[f32; 16]) -> f32 {
    // SAFETY: lanes has 16 values.
    hsum(unsafe { _mm512_loadu_ps(lanes.as_ptr()) })
}

/// The AVX-512 dequantizer of `ty`, if there is one.
///
/// The returned safe wrappers execute AVX-512 instructions: [`super::dequant_simd`] hands
/// them out only after checking the CPU has this level, and nothing else may call them.
pub(crate) fn dequant_fn(ty: GgmlType) -> Option<DequantFn> {
    super::avx512_dequant::lookup(ty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsum16_equals_sixteen_hsums_bit_for_bit() {
        if !crate::SimdLevel::Avx512.is_available() {
            println!("skipped: avx512 not available on this CPU");
            return;
        }
        // Values of mixed magnitude so that any change in the pairing changes the bits.
        let mut s = 12_345u32;
        let vals: Vec<f32> = (0..256)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s % 100_000) as f32 * 10f32.powi((s % 9) as i32 - 4) - 3.0
            })
            .collect();
        // SAFETY: AVX-512 checked above; each load reads 16 of the 256 values.
        let v: [__m512; 16] =
            std::array::from_fn(|i| unsafe { _mm512_loadu_ps(vals.as_ptr().add(16 * i)) });
        // SAFETY: AVX-512 checked above.
        let got = unsafe { hsum16(&v) };
        for i in 0..16 {
            // SAFETY: AVX-512 checked above.
            let want = unsafe { hsum(v[i]) };
            assert_eq!(got[i].to_bits(), want.to_bits(), "vector {i}");
        }
        // Test of the test: a plain left-to-right sum, another order, must differ from the
        // pairwise one on some of these vectors.
        let differ = (0..16)
            .filter(|&i| {
                vals[16 * i..16 * i + 16].iter().sum::<f32>().to_bits() != got[i].to_bits()
            })
            .count();
        assert!(differ > 0);
    }
}
