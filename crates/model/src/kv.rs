//! The key/value cache of one session: per layer, one key and one value row per position.
//!
//! Layout per layer: `ctx` key rows then `ctx` value rows, each row `n_kv_head × head_dim`
//! values. f16 halves the memory and matches llama.cpp's default; f32 is there for exactness
//! checks; q8 stores each head's values of a row as signed bytes with one f32 scale (a
//! little more than half of f16's bytes, and not exact: see [`KvType::Q8`]). Attention reads
//! the rows in place ([`KvCache::rows`]): its kernels widen f16 and bytes as they load them,
//! exactly, so f16 and f32 give the bits of the same f32 values.

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
    /// Signed bytes, one f32 scale per head of each row: the head's `head_dim` values `x`
    /// are stored as `q = round(x · (1 / d))` with `d = max|x| / 127` (ties away from zero),
    /// and read back as `d · q`. Attention multiplies each score by its key's scale and each
    /// probability by its value's scale, so the kernels see plain bytes.
    Q8,
}

impl KvType {
    /// The name the command line uses.
    pub fn name(self) -> &'static str {
        match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8 => "q8",
        }
    }

    /// Bytes of one stored element (of [`KvType::row_elems`]).
    pub fn elem_bytes(self) -> usize {
        match self {
            KvType::F16 => 2,
            KvType::F32 => 4,
            KvType::Q8 => 1,
        }
    }

    /// Stored elements of one position's keys (or values) for `n_kv_head` heads of
    /// `head_dim` values (`None` on overflow): the values, and for q8 four bytes per head
    /// for the scales.
    pub fn row_elems(self, n_kv_head: usize, head_dim: usize) -> Option<usize> {
        let values = n_kv_head.checked_mul(head_dim)?;
        match self {
            KvType::F16 | KvType::F32 => Some(values),
            KvType::Q8 => values.checked_add(n_kv_head.checked_mul(4)?),
        }
    }
}

/// The stored rows. q8 keeps its scales apart from the bytes, head-major (per layer, the
/// keys' `ctx` scales of head 0, of head 1, ..., then the values'), so every row's bytes
/// start where an unscaled row would (the kernels fetch a head's values ahead of use, and a
/// scale inside the rows cost a line of its own) and one head's scales over consecutive
/// positions are one slice.
#[derive(Debug)]
pub(crate) enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Q8 { q: Vec<i8>, d: Vec<f32> },
}

/// Key/value rows for `n_layer` layers and `ctx` positions.
#[derive(Debug)]
pub struct KvCache {
    pub(crate) store: Store,
    ctx: usize,
    pub(crate) heads: usize,
    head_dim: usize,
    /// Values per row: `n_kv_head × head_dim`.
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
    /// Signed bytes and their scales ([`KvType::Q8`]).
    Q8 {
        /// Key rows.
        k: &'a [i8],
        /// Value rows.
        v: &'a [i8],
        /// The key rows' scales.
        kd: Q8Scales<'a>,
        /// The value rows' scales.
        vd: Q8Scales<'a>,
    },
}

/// The scales of one layer's q8 keys (or values) at some positions, per head.
#[derive(Debug, Clone, Copy)]
pub struct Q8Scales<'a> {
    /// Every head's scales of the layer, head-major, `ctx` each.
    d: &'a [f32],
    ctx: usize,
    /// The positions.
    range: (usize, usize),
}

impl<'a> Q8Scales<'a> {
    /// The scales of head `h` at the positions, in order.
    pub fn head(&self, h: usize) -> &'a [f32] {
        let at = h * self.ctx;
        &self.d[at + self.range.0..at + self.range.1]
    }
}

/// Stores one head's `x` as q8 bytes in `q` and returns its scale ([`KvType::Q8`]).
fn quantize_head(x: &[f32], q: &mut [i8]) -> f32 {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    for (q, &v) in q.iter_mut().zip(x) {
        // `as` saturates, and sends NaN to 0.
        *q = (v * id).round().clamp(-127.0, 127.0) as i8;
    }
    d
}

impl KvCache {
    /// A zeroed cache for rows of `heads` heads of `head_dim` values. Fails cleanly when the
    /// cache cannot be allocated.
    pub fn new(
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<KvCache, ModelError> {
        let row = heads.checked_mul(head_dim);
        let rows = n_layer.checked_mul(2).and_then(|x| x.checked_mul(ctx));
        let n = rows.and_then(|x| x.checked_mul(row?));
        let store = match ty {
            KvType::F16 => Store::F16(try_vec(n, f16::ZERO, "KV cache")?),
            KvType::F32 => Store::F32(try_vec(n, 0.0, "KV cache")?),
            KvType::Q8 => Store::Q8 {
                q: try_vec(n, 0, "KV cache")?,
                d: try_vec(rows.and_then(|x| x.checked_mul(heads)), 0.0, "KV cache")?,
            },
        };
        Ok(KvCache {
            store,
            ctx,
            heads,
            head_dim,
            row: row.unwrap_or(0),
        })
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
            Store::Q8 { .. } => KvType::Q8,
        }
    }

    /// Stored elements per row ([`KvType::row_elems`]).
    pub fn row_elems(&self) -> usize {
        match self.store {
            Store::Q8 { .. } => self.row + 4 * self.heads,
            _ => self.row,
        }
    }

    /// Index of row `pos` of the keys (or values) of `layer`, counted in rows.
    fn row_index(&self, layer: usize, value: bool, pos: usize) -> usize {
        (layer * 2 + usize::from(value)) * self.ctx + pos
    }

    /// Offset of row `pos` of the keys (or values) of `layer`, in values.
    pub(crate) fn offset(&self, layer: usize, value: bool, pos: usize) -> usize {
        self.row_index(layer, value, pos) * self.row
    }

    /// Offset of the scale of head `h` of row `pos` (q8), in scales.
    pub(crate) fn scale_offset(&self, layer: usize, value: bool, h: usize, pos: usize) -> usize {
        self.row_index(layer, value, 0) * self.heads + h * self.ctx + pos
    }

    /// Writes the key and value rows of consecutive positions starting at `pos`
    /// (`k` and `v` hold `n × n_kv_head × head_dim` values). The caller checks
    /// `pos + n <= ctx`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        for (value, src) in [(false, k), (true, v)] {
            let o = self.offset(layer, value, pos);
            let so = self.scale_offset(layer, value, 0, pos);
            let (hd, heads, ctx) = (self.head_dim, self.heads, self.ctx);
            match &mut self.store {
                // The slice conversions use F16C eight lanes at a time; per-element
                // `f16::from_f32` calls were a tenth of decode time.
                Store::F16(d) => d[o..o + src.len()].convert_from_f32_slice(src),
                Store::F32(d) => d[o..o + src.len()].copy_from_slice(src),
                Store::Q8 { q, d } => {
                    let rows = q[o..o + src.len()].chunks_exact_mut(heads * hd);
                    for (p, (q, x)) in rows.zip(src.chunks_exact(heads * hd)).enumerate() {
                        for (h, (q, x)) in
                            q.chunks_exact_mut(hd).zip(x.chunks_exact(hd)).enumerate()
                        {
                            d[so + h * ctx + p] = quantize_head(x, q);
                        }
                    }
                }
            }
        }
    }

    /// The key and value rows of `layer` at positions `range` (`range.len() × row` values
    /// each, position-major, and for q8 `range.len() × n_kv_head` scales), as stored. The
    /// caller keeps `range` within `ctx`.
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
            Store::Q8 { q, d } => {
                let scales = |value| {
                    let at = self.scale_offset(layer, value, 0, 0);
                    Q8Scales {
                        d: &d[at..at + self.heads * self.ctx],
                        ctx: self.ctx,
                        range: (range.start, range.end),
                    }
                };
                KvRows::Q8 {
                    k: &q[ko..ko + n],
                    v: &q[vo..vo + n],
                    kd: scales(false),
                    vd: scales(true),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and value rows as f32 values (q8 heads of `hd` values dequantized: scale
    /// times byte).
    fn widened(rows: KvRows<'_>, hd: usize) -> (Vec<f32>, Vec<f32>) {
        let wide = |d: &[f16]| d.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
        let deq = |q: &[i8], d: Q8Scales<'_>| {
            let heads = q.len() / hd / (d.range.1 - d.range.0);
            q.chunks_exact(hd)
                .enumerate()
                .flat_map(|(i, q)| {
                    let d = d.head(i % heads)[i / heads];
                    q.iter().map(move |&b| d * f32::from(b))
                })
                .collect::<Vec<f32>>()
        };
        match rows {
            KvRows::F16 { k, v } => (wide(k), wide(v)),
            KvRows::F32 { k, v } => (k.to_vec(), v.to_vec()),
            KvRows::Q8 { k, v, kd, vd } => (deq(k, kd), deq(v, vd)),
        }
    }

    #[test]
    fn rows_round_trip_per_layer() {
        // Values q8 holds exactly: every head's largest magnitude is 127 times a power of
        // two, and the others are multiples of that power.
        for ty in [KvType::F16, KvType::F32, KvType::Q8] {
            let mut kv = KvCache::new(ty, 2, 4, 2, 3).unwrap();
            let k: Vec<f32> = [1, 2, 127, -127, 5, 0, 3, -4, 127, 0, 0, 0]
                .map(|i| i as f32)
                .to_vec();
            let v: Vec<f32> = k.iter().map(|x| -x / 4.0).collect();
            kv.store(1, 2, &k, &v);
            assert_eq!(widened(kv.rows(1, 2..4), 3), (k.clone(), v.clone()));
            assert_eq!(widened(kv.rows(1, 3..4), 3).1, &v[6..]);
            // Layer 0 was never written.
            assert_eq!(widened(kv.rows(0, 2..3), 3).0, [0.0; 6]);
            assert_eq!(kv.ty(), ty);
        }
    }

    #[test]
    fn f16_rounds_to_half_precision() {
        let mut kv = KvCache::new(KvType::F16, 1, 1, 1, 1).unwrap();
        kv.store(0, 0, &[1.0 + 1e-4], &[0.1]);
        let (k, v) = widened(kv.rows(0, 0..1), 1);
        assert_eq!(k, [1.0]);
        assert_eq!(v, [f16::from_f32(0.1).to_f32()]);
    }

    /// q8 against its definition, written out here: per head, the scale is the largest
    /// magnitude over 127 and each value rounds to the nearest multiple of it (ties away
    /// from zero), so every value comes back within half a scale step; a zero head, NaN
    /// and infinities store without a panic.
    #[test]
    fn q8_rounds_each_head_to_its_own_scale() {
        let (heads, hd) = (3, 64);
        let mut k: Vec<f32> = (0..heads * hd)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        // Head 1 is a hundred times smaller than head 0; head 2 is all zeros.
        k[hd..2 * hd].iter_mut().for_each(|x| *x /= 100.0);
        k[2 * hd..].iter_mut().for_each(|x| *x = 0.0);
        let mut kv = KvCache::new(KvType::Q8, 1, 2, heads, hd).unwrap();
        kv.store(0, 0, &k, &k);
        let (back, _) = widened(kv.rows(0, 0..1), hd);
        for h in 0..heads {
            let x = &k[h * hd..(h + 1) * hd];
            let d = x.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            for (a, b) in x.iter().zip(&back[h * hd..(h + 1) * hd]) {
                assert!(
                    (a - b).abs() <= d / 2.0 * 1.0001,
                    "head {h}: {a} came back as {b}"
                );
            }
        }
        assert!(back[2 * hd..].iter().all(|&x| x == 0.0));
        let odd = [f32::NAN, f32::INFINITY, -1.0, 2.5];
        let mut kv = KvCache::new(KvType::Q8, 1, 1, 2, 2).unwrap();
        kv.store(0, 0, &odd, &odd);
        let (back, _) = widened(kv.rows(0, 0..1), 2);
        let d = 2.5f32 / 127.0;
        assert_eq!(&back[2..], [-51.0 * d, 127.0 * d]);
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        assert!(KvCache::new(KvType::F16, 30, usize::MAX / 4, 3, 64).is_err());
        assert!(KvCache::new(KvType::F32, 1, 1 << 60, 1, 1).is_err());
        assert!(KvCache::new(KvType::Q8, 1, 1, usize::MAX / 2, 1).is_err());
    }
}
