//! The key/value cache of one session: per layer, one key and one value row per position.
//!
//! Layout per layer: `ctx` key rows then `ctx` value rows, each row `n_kv_head × head_dim`
//! values. f16 halves the memory and matches llama.cpp's default; f32 is there for exactness
//! checks. Attention reads the rows in place ([`KvCache::rows`]): its kernels widen f16 as
//! they load it, exactly, so both types give the bits of the same f32 values.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::ModelError;

/// A vector of `n` copies of `v`, or an error instead of an abort when the size overflows
/// or the allocation fails (context sizes come from users).
pub(crate) fn try_vec<T: Clone>(n: Option<usize>, v: T, what: &str) -> Result<Vec<T>, ModelError> {
    let fail = || ModelError::InvalidArgument(format!("cannot allocate the {what}"));
    let n = n.ok_or_else(fail)?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| fail())?;
    out.resize(n, v);
    Ok(out)
}

/// Element type of the KV cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvType {
    /// IEEE half precision (default).
    #[default]
    F16,
    /// IEEE single precision.
    F32,
}

#[derive(Debug)]
pub(crate) enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
}

/// Key/value rows for `n_layer` layers and `ctx` positions.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) store: Store,
    ctx: usize,
    pub(crate) row: usize,
}

/// The stored key and value rows of one layer's positions, in the cache's element type (see
/// [`KvCache::rows`]).
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// IEEE halves.
    F16 {
        /// Key rows.
        k: &'a [f16],
        /// Value rows.
        v: &'a [f16],
    },
    /// Single precision.
    F32 {
        /// Key rows.
        k: &'a [f32],
        /// Value rows.
        v: &'a [f32],
    },
}

impl KvCache {
    /// A zeroed cache. `row` is `n_kv_head × head_dim`. Fails cleanly when the cache
    /// cannot be allocated.
    pub fn new(ty: KvType, n_layer: usize, ctx: usize, row: usize) -> Result<KvCache, ModelError> {
        let n = n_layer
            .checked_mul(2)
            .and_then(|x| x.checked_mul(ctx))
            .and_then(|x| x.checked_mul(row));
        let store = match ty {
            KvType::F16 => Store::F16(try_vec(n, f16::ZERO, "KV cache")?),
            KvType::F32 => Store::F32(try_vec(n, 0.0, "KV cache")?),
        };
        Ok(KvCache { store, ctx, row })
    }

    /// Number of positions the cache holds.
    pub fn ctx(&self) -> usize {
        self.ctx
    }

    /// Element type.
    pub fn ty(&self) -> KvType {
        match self.store {
            Store::F16(_) => KvType::F16,
            Store::F32(_) => KvType::F32,
        }
    }

    pub(crate) fn offset(&self, layer: usize, value: bool, pos: usize) -> usize {
        ((layer * 2 + usize::from(value)) * self.ctx + pos) * self.row
    }

    /// Writes the key and value rows of consecutive positions starting at `pos`
    /// (`k` and `v` hold `n × row` values). The caller checks `pos + n <= ctx`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for (value, src) in [(false, k), (true, v)] {
            let o = self.offset(layer, value, pos);
            match &mut self.store {
                // The slice conversions use F16C eight lanes at a time; per-element
                // `f16::from_f32` calls were a tenth of decode time.
                Store::F16(d) => d[o..o + src.len()].convert_from_f32_slice(src),
                Store::F32(d) => d[o..o + src.len()].copy_from_slice(src),
            }
        }
    }

    /// The key and value rows of `layer` at positions `range` (`range.len() × row` values
    /// each, position-major), as stored. The caller keeps `range` within `ctx`.
    pub fn rows(&self, layer: usize, range: std::ops::Range<usize>) -> KvRows<'_> {
        let (ko, vo) = (
            self.offset(layer, false, range.start),
            self.offset(layer, true, range.start),
        );
        let n = range.len() * self.row;
        match &self.store {
            Store::F16(d) => KvRows::F16 {
                k: &d[ko..ko + n],
                v: &d[vo..vo + n],
            },
            Store::F32(d) => KvRows::F32 {
                k: &d[ko..ko + n],
                v: &d[vo..vo + n],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and value rows as f32 (exact for both element types).
    fn widened(rows: KvRows<'_>) -> (Vec<f32>, Vec<f32>) {
        let wide = |d: &[f16]| d.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
        match rows {
            KvRows::F16 { k, v } => (wide(k), wide(v)),
            KvRows::F32 { k, v } => (k.to_vec(), v.to_vec()),
        }
    }

    #[test]
    fn rows_round_trip_per_layer() {
        for ty in [KvType::F16, KvType::F32] {
            let mut kv = KvCache::new(ty, 2, 4, 6).unwrap();
            let k: Vec<f32> = (0..12).map(|i| i as f32).collect();
            let v: Vec<f32> = (0..12).map(|i| -(i as f32)).collect();
            kv.store(1, 2, &k, &v);
            assert_eq!(widened(kv.rows(1, 2..4)), (k.clone(), v.clone()));
            assert_eq!(widened(kv.rows(1, 3..4)).1, &v[6..]);
            // Layer 0 was never written.
            assert_eq!(widened(kv.rows(0, 2..3)).0, [0.0; 6]);
            assert_eq!(kv.ty(), ty);
        }
    }

    #[test]
    fn f16_rounds_to_half_precision() {
        let mut kv = KvCache::new(KvType::F16, 1, 1, 1).unwrap();
        kv.store(0, 0, &[1.0 + 1e-4], &[0.1]);
        let (k, v) = widened(kv.rows(0, 0..1));
        assert_eq!(k, [1.0]);
        assert_eq!(v, [f16::from_f32(0.1).to_f32()]);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        assert!(KvCache::new(KvType::F16, 30, usize::MAX / 4, 192).is_err());
        assert!(KvCache::new(KvType::F32, 1, 1 << 60, 1).is_err());
    }
}
