//! Helpers shared by the CPU benchmark examples: a deterministic generator, random weight
//! matrices whose blocks decode to finite values, a median timer and a thread CPU clock.
// Each example compiles this module on its own and uses a subset of it.
#![allow(dead_code)]

use std::time::Instant;

use ferrite_gguf::GgmlType;

pub use ferrite_testkit::XorShift as Rng;

/// Offsets of IEEE-half scale fields, so random blocks decode to finite values.
fn half_fields(ty: GgmlType) -> &'static [usize] {
    use GgmlType as T;
    match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::Q6_K => &[208],
        _ => &[],
    }
}

/// `rows` random rows of `cols` values of `ty`, with small finite scales.
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let ts = ty.type_size() as usize;
    let n = rows * ty.row_bytes(cols as u64).expect("whole blocks") as usize;
    let mut v = vec![0u8; n];
    for c in v.chunks_mut(8) {
        let r = rng.next_u64().to_le_bytes();
        c.copy_from_slice(&r[..c.len()]);
    }
    let small = half::f16::from_f32(0.01).to_le_bytes();
    match ty {
        GgmlType::F32 => {
            for c in v.chunks_exact_mut(4) {
                c.copy_from_slice(&(rng.f32() * 0.01).to_le_bytes());
            }
        }
        GgmlType::F16 | GgmlType::BF16 => {
            for c in v.chunks_exact_mut(2) {
                c.copy_from_slice(&small);
            }
        }
        _ => {
            for b in v.chunks_exact_mut(ts) {
                for &o in half_fields(ty) {
                    b[o..o + 2].copy_from_slice(&small);
                }
            }
        }
    }
    v
}

/// CPU time of the calling thread in seconds (`CLOCK_THREAD_CPUTIME_ID`), where the
/// platform has it: with one thread and other processes competing for the cores, a steadier
/// measure than wall time.
pub fn thread_cpu() -> Option<f64> {
    #[cfg(all(target_os = "linux", target_pointer_width = "64"))]
    {
        #[repr(C)]
        struct Timespec {
            sec: i64,
            nsec: i64,
        }
        unsafe extern "C" {
            fn clock_gettime(clock: i32, tp: *mut Timespec) -> i32;
        }
        const CLOCK_THREAD_CPUTIME_ID: i32 = 3;
        let mut t = Timespec { sec: 0, nsec: 0 };
        // SAFETY: clock_gettime writes one timespec (two 64-bit fields on 64-bit Linux)
        // through a valid pointer to a live local.
        let rc = unsafe { clock_gettime(CLOCK_THREAD_CPUTIME_ID, &mut t) };
        (rc == 0).then_some(t.sec as f64 + t.nsec as f64 * 1e-9)
    }
    #[cfg(not(all(target_os = "linux", target_pointer_width = "64")))]
    None
}

/// Median, min, max of `trials` timings of `f` in seconds (after one warm-up call).
pub fn time<F: FnMut()>(trials: usize, mut f: F) -> (f64, f64, f64) {
    f();
    let mut t: Vec<f64> = (0..trials)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[t.len() / 2], t[0], t[t.len() - 1])
}
