//! The key/value cache of one session: per layer, one key and one value row per position.
//!
//! Layout per layer: `ctx` key rows then `ctx` value rows, each row `n_kv_head × head_dim`
//! values. A cache whose values lie in its keys ([`Values::InKeys`], MLA's latent) holds
//! the key rows only, and hands them out as the value rows too. f16 halves the memory and matches llama.cpp's default; f32 is there for exactness
//! checks; q8 stores blocks of 32 values as signed bytes with one f32 scale (56 % of f16's
//! bytes, and not exact: see [`KvType::Q8`]). Attention reads the rows in place
//! ([`KvCache::rows`]): its kernels widen f16 and q8 blocks as they load them, exactly, so
//! every type gives the bits of attention over the f32 values it stores. The cache never
//! computes: it stores rows and hands them out.

use ferrite_backend::{BackendError, KvType, Values};
use ferrite_quant::kernels::Q8Block;
use half::f16;
use half::slice::HalfFloatSliceExt;

// The contract's q8 element is this block, byte for byte (its f32 scale, then 32 quants).
const _: () = assert!(std::mem::size_of::<Q8Block>() == 36);

/// A vector of `n` copies of `v`, or an error instead of an abort when the size overflows
/// or the allocation fails (context sizes come from users).
fn try_vec<T: Clone>(n: Option<usize>, v: T) -> Result<Vec<T>, BackendError> {
    let fail = || BackendError::Alloc { what: "KV cache" };
    let n = n.ok_or_else(fail)?;
    let mut out = Vec::new();
    out.try_reserve_exact(n).map_err(|_| fail())?;
    out.resize(n, v);
    Ok(out)
}

#[derive(Debug)]
enum Store {
    F16(Vec<f16>),
    F32(Vec<f32>),
    Q8(Vec<Q8Block>),
}

/// Key/value rows for `n_layer` layers and `ctx` positions.
#[derive(Debug)]
pub struct KvCache {
    store: Store,
    n_layer: usize,
    ctx: usize,
    /// Stored elements per row ([`KvType::row_elems`]).
    row: usize,
    /// Whether value rows are stored beside the keys (else the keys serve as both).
    own_values: bool,
    /// The recurrent layers' state, `state_len` f32 values a slot (empty for models of
    /// attention only); it describes exactly the positions the session has run.
    state: Vec<f32>,
    state_len: usize,
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
    /// Blocks of signed bytes and their scales.
    Q8 {
        /// Key rows.
        k: &'a [Q8Block],
        /// Value rows.
        v: &'a [Q8Block],
    },
}

/// `x` (32 values) as a q8 block ([`KvType::Q8`]).
fn quantize_block(x: &[f32]) -> Q8Block {
    let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    Q8Block {
        d,
        q: std::array::from_fn(|i| round_quant(x[i] * id)),
    }
}

/// `v.round().clamp(-127.0, 127.0)` as a byte (NaN gives 0), without `round`: on the
/// baseline x86-64 target it is a library call per value, which made a 512-token prefill
/// quantize its rows noticeably slower. Truncation and the exact remainder give the same
/// result: ties go away from zero.
#[inline]
fn round_quant(v: f32) -> i8 {
    let v = v.clamp(-127.0, 127.0);
    // `as` truncates toward zero and sends NaN to 0; `v - t` is exact.
    let t = v as i32;
    let frac = v - t as f32;
    let r = if frac >= 0.5 {
        t + 1
    } else if frac <= -0.5 {
        t - 1
    } else {
        t
    };
    r as i8
}

impl KvCache {
    /// A zeroed cache for rows of `heads` heads of `head_dim` values. Fails cleanly when the
    /// cache cannot be allocated, or the type cannot hold such rows.
    pub fn new(
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<KvCache, BackendError> {
        KvCache::with_values(ty, n_layer, ctx, (heads, head_dim), Values::Own)
    }

    /// [`KvCache::new`] for values from `values`: with [`Values::InKeys`] the cache keeps
    /// key rows only, half the memory.
    pub fn with_values(
        ty: KvType,
        n_layer: usize,
        ctx: usize,
        (heads, head_dim): (usize, usize),
        values: Values,
    ) -> Result<KvCache, BackendError> {
        let row = ty.check_row(heads, head_dim)?;
        values.check(head_dim).map_err(|why| BackendError::Shape {
            op: "kv",
            what: why,
        })?;
        let own_values = values.stored();
        let n = n_layer
            .checked_mul(1 + usize::from(own_values))
            .and_then(|x| x.checked_mul(ctx))
            .and_then(|x| x.checked_mul(row));
        let store = match ty {
            KvType::F16 => Store::F16(try_vec(n, f16::ZERO)?),
            KvType::F32 => Store::F32(try_vec(n, 0.0)?),
            KvType::Q8 => Store::Q8(try_vec(n, Q8Block::default())?),
        };
        Ok(KvCache {
            store,
            n_layer,
            ctx,
            row,
            own_values,
            state: Vec::new(),
            state_len: 0,
        })
    }

    /// Replaces the recurrent state by `slots` zeroed slots of `len` values.
    pub fn set_state(&mut self, slots: usize, len: usize) -> Result<(), BackendError> {
        self.state = try_vec(slots.checked_mul(len), 0.0)?;
        self.state_len = len;
        Ok(())
    }

    /// Values of one recurrent state slot (0 without recurrent state).
    pub fn state_len(&self) -> usize {
        self.state_len
    }

    /// Every slot's state, slot after slot.
    pub fn state(&self) -> &[f32] {
        &self.state
    }

    /// Every slot's state, for restoring it.
    pub fn state_all_mut(&mut self) -> &mut [f32] {
        &mut self.state
    }

    /// Slot `slot`'s state, `None` past the slots the cache has.
    pub fn state_mut(&mut self, slot: usize) -> Option<&mut [f32]> {
        let at = slot.checked_mul(self.state_len)?;
        self.state.get_mut(at..at.checked_add(self.state_len)?)
    }

    /// Zeroes the recurrent state (the session's position returns to 0).
    pub fn clear_state(&mut self) {
        self.state.fill(0.0);
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
            Store::Q8(_) => KvType::Q8,
        }
    }

    /// Stored elements per key (or value) row ([`KvType::row_elems`]).
    pub fn row(&self) -> usize {
        self.row
    }

    /// Values per key (or value) row: `n_kv_head × head_dim`.
    pub fn row_values(&self) -> usize {
        match self.store {
            Store::Q8(_) => self.row * 32,
            Store::F16(_) | Store::F32(_) => self.row,
        }
    }

    /// Number of layers.
    pub fn n_layer(&self) -> usize {
        self.n_layer
    }

    /// Appends the first `n` key rows (`value`: value rows) of `layer` to `out` as stored:
    /// f16 or f32 bits little-endian, or q8 blocks as their scale's bits then their 32
    /// quants. The caller keeps `n <= ctx`. Without value rows of its own, the key rows
    /// stand for them.
    pub fn export_rows(&self, layer: usize, value: bool, n: usize, out: &mut Vec<u8>) {
        let o = self.offset(layer, value, 0);
        let len = n * self.row;
        match &self.store {
            Store::F16(d) => d[o..o + len]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
            Store::F32(d) => d[o..o + len]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
            Store::Q8(d) => d[o..o + len].iter().for_each(|b| {
                out.extend_from_slice(&b.d.to_bits().to_le_bytes());
                out.extend(b.q.map(|q| q as u8));
            }),
        }
    }

    /// Overwrites the first `n` key rows (`value`: value rows) of `layer` with `src`, in
    /// the layout of [`KvCache::export_rows`]. The caller keeps `n <= ctx` and `src` that
    /// long. Value rows are ignored by a cache without value rows of its own: they are its
    /// keys again, which the key rows already set.
    pub fn import_rows(&mut self, layer: usize, value: bool, n: usize, src: &[u8]) {
        if value && !self.own_values {
            return;
        }
        let o = self.offset(layer, value, 0);
        let len = n * self.row;
        match &mut self.store {
            Store::F16(d) => {
                for (x, b) in d[o..o + len].iter_mut().zip(src.chunks_exact(2)) {
                    *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            Store::F32(d) => {
                for (x, b) in d[o..o + len].iter_mut().zip(src.chunks_exact(4)) {
                    *x = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                }
            }
            Store::Q8(d) => {
                let bytes = src.chunks_exact(KvType::Q8.elem_bytes());
                for (x, b) in d[o..o + len].iter_mut().zip(bytes) {
                    x.d = f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
                    x.q = std::array::from_fn(|i| b[4 + i] as i8);
                }
            }
        }
    }

    /// Offset of row `pos` of the keys (or values) of `layer`, in elements; the values of
    /// a cache without value rows of its own are its keys.
    fn offset(&self, layer: usize, value: bool, pos: usize) -> usize {
        let planes = 1 + usize::from(self.own_values);
        let plane = usize::from(value && self.own_values);
        ((layer * planes + plane) * self.ctx + pos) * self.row
    }

    /// Writes the key and value rows of consecutive positions starting at `pos`
    /// (`k` and `v` hold `n × n_kv_head × head_dim` values; `v` is not read by a cache
    /// without value rows of its own). The caller checks `pos + n <= ctx`.
    pub fn store(&mut self, layer: usize, pos: usize, k: &[f32], v: &[f32]) {
        let planes: &[(bool, &[f32])] = if self.own_values {
            &[(false, k), (true, v)]
        } else {
            &[(false, k)]
        };
        for &(value, src) in planes {
            let o = self.offset(layer, value, pos);
            match &mut self.store {
                // The slice conversions use F16C eight lanes at a time; per-element
                // `f16::from_f32` calls were a tenth of decode time.
                Store::F16(d) => d[o..o + src.len()].convert_from_f32_slice(src),
                Store::F32(d) => d[o..o + src.len()].copy_from_slice(src),
                Store::Q8(d) => {
                    let blocks = src.chunks_exact(32).map(quantize_block);
                    d[o..o + src.len() / 32]
                        .iter_mut()
                        .zip(blocks)
                        .for_each(|(d, b)| *d = b);
                }
            }
        }
    }

    /// The key and value rows of `layer` at positions `range` (`range.len()` rows of
    /// [`KvType::row_elems`] elements each, position-major), as stored. The caller keeps
    /// `range` within `ctx`.
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
            Store::Q8(d) => KvRows::Q8 {
                k: &d[ko..ko + n],
                v: &d[vo..vo + n],
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key and value rows as f32 values (q8 blocks dequantized: scale times quant).
    fn widened(rows: KvRows<'_>) -> (Vec<f32>, Vec<f32>) {
        let wide = |d: &[f16]| d.iter().map(|h| h.to_f32()).collect::<Vec<f32>>();
        let deq = |b: &[Q8Block]| {
            b.iter()
                .flat_map(|b| b.q.map(|q| b.d * f32::from(q)))
                .collect::<Vec<f32>>()
        };
        match rows {
            KvRows::F16 { k, v } => (wide(k), wide(v)),
            KvRows::F32 { k, v } => (k.to_vec(), v.to_vec()),
            KvRows::Q8 { k, v } => (deq(k), deq(v)),
        }
    }

    #[test]
    fn rows_round_trip_per_layer() {
        // Values q8 holds exactly: every block's largest magnitude is 127 times a power of
        // two, and the others are multiples of that power.
        for ty in [KvType::F16, KvType::F32, KvType::Q8] {
            let mut kv = KvCache::new(ty, 2, 4, 2, 32).unwrap();
            let k: Vec<f32> = (0..128)
                .map(|i| {
                    if i % 32 == 5 {
                        127.0
                    } else {
                        (i % 9) as f32 - 4.0
                    }
                })
                .collect();
            let v: Vec<f32> = k.iter().map(|x| -x / 4.0).collect();
            kv.store(1, 2, &k, &v);
            assert_eq!(widened(kv.rows(1, 2..4)), (k.clone(), v.clone()));
            assert_eq!(widened(kv.rows(1, 3..4)).1, &v[64..]);
            // Layer 0 was never written.
            assert_eq!(widened(kv.rows(0, 2..3)).0, [0.0; 64]);
            assert_eq!(kv.ty(), ty);
        }
    }

    #[test]
    fn f16_rounds_to_half_precision() {
        let mut kv = KvCache::new(KvType::F16, 1, 1, 1, 1).unwrap();
        kv.store(0, 0, &[1.0 + 1e-4], &[0.1]);
        let (k, v) = widened(kv.rows(0, 0..1));
        assert_eq!(k, [1.0]);
        assert_eq!(v, [f16::from_f32(0.1).to_f32()]);
    }

    /// q8 against its definition, written out here: per block of 32, the scale is the
    /// largest magnitude over 127 and each value rounds to the nearest multiple of it, so
    /// every value comes back within half a scale step; a zero block, NaN and infinities
    /// store without a panic.
    #[test]
    fn q8_rounds_each_block_to_its_own_scale() {
        let (heads, hd) = (3, 64);
        let mut k: Vec<f32> = (0..heads * hd)
            .map(|i| ((i * 7919) % 1000) as f32 / 100.0 - 5.0)
            .collect();
        // The second block is a hundred times smaller than the first; the last is zero.
        k[32..64].iter_mut().for_each(|x| *x /= 100.0);
        k[160..].iter_mut().for_each(|x| *x = 0.0);
        let mut kv = KvCache::new(KvType::Q8, 1, 2, heads, hd).unwrap();
        kv.store(0, 0, &k, &k);
        let (back, _) = widened(kv.rows(0, 0..1));
        for (b, (x, y)) in k.chunks(32).zip(back.chunks(32)).enumerate() {
            let d = x.iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
            for (a, c) in x.iter().zip(y) {
                assert!(
                    (a - c).abs() <= d / 2.0 * 1.0001,
                    "block {b}: {a} came back as {c}"
                );
            }
        }
        assert!(back[160..].iter().all(|&x| x == 0.0));
        let mut odd = vec![1.0f32; 64];
        odd[..3].copy_from_slice(&[f32::NAN, f32::INFINITY, -1.0]);
        let mut kv = KvCache::new(KvType::Q8, 1, 1, 1, 64).unwrap();
        kv.store(0, 0, &odd, &odd);
        let (back, _) = widened(kv.rows(0, 0..1));
        assert_eq!(&back[32..], &odd[32..]);
    }

    /// The rounding equals `round` then clamping on every f32 from -200 to 200 (a stride of
    /// the bit patterns that includes every tie between consecutive integers), and on NaN
    /// and the infinities.
    #[test]
    fn quant_rounding_is_round_then_clamp() {
        let want = |v: f32| v.round().clamp(-127.0, 127.0) as i8;
        let mut checked = 0;
        for bits in (0..=200f32.to_bits())
            .step_by(97)
            .chain((0..=127).map(|i| (i as f32 + 0.5).to_bits()))
        {
            for v in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(round_quant(v), want(v), "{v}");
                checked += 1;
            }
        }
        assert!(checked > 20_000_000);
        for v in [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.49999997,
            -0.49999997,
        ] {
            assert_eq!(round_quant(v), want(v), "{v}");
        }
    }

    #[test]
    fn q8_needs_head_sizes_of_whole_blocks() {
        let err = KvCache::new(KvType::Q8, 1, 4, 2, 48)
            .unwrap_err()
            .to_string();
        assert!(err.contains("multiples of 32"), "{err}");
        assert!(KvCache::new(KvType::F16, 1, 4, 2, 48).is_ok());
    }

    #[test]
    fn impossible_sizes_are_errors_not_aborts() {
        assert!(KvCache::new(KvType::F16, 30, usize::MAX / 4, 3, 64).is_err());
        assert!(KvCache::new(KvType::F32, 1, 1 << 60, 1, 1).is_err());
        assert!(KvCache::new(KvType::Q8, 1, 1, usize::MAX / 2, 1).is_err());
    }

    /// A cache whose values lie in its keys holds half the elements, hands its key rows
    /// out as the value rows, exports them as such, and ignores imported value rows; one
    /// with values outside its key heads is refused.
    #[test]
    fn values_in_keys_keep_key_rows_only() {
        let values = Values::InKeys { at: 2, dim: 6 };
        let mut kv = KvCache::with_values(KvType::F32, 2, 3, (1, 8), values).unwrap();
        let own = KvCache::new(KvType::F32, 2, 3, 1, 8).unwrap();
        let len = |c: &KvCache| match &c.store {
            Store::F32(d) => d.len(),
            _ => unreachable!(),
        };
        assert_eq!(2 * len(&kv), len(&own));
        let k: Vec<f32> = (0..16).map(|i| i as f32).collect();
        kv.store(1, 1, &k, &[f32::NAN; 16]);
        let (keys, vals) = widened(kv.rows(1, 1..3));
        assert_eq!((&keys, &vals), (&k, &k));
        let (mut key_bytes, mut value_bytes) = (Vec::new(), Vec::new());
        kv.export_rows(1, false, 3, &mut key_bytes);
        kv.export_rows(1, true, 3, &mut value_bytes);
        assert_eq!(key_bytes, value_bytes);
        kv.import_rows(1, true, 3, &vec![0xff; value_bytes.len()]);
        assert_eq!(widened(kv.rows(1, 1..3)).0, k);
        // Layer 0 is its own plane.
        assert!(widened(kv.rows(0, 0..3)).0.iter().all(|&x| x == 0.0));
        let past = Values::InKeys { at: 4, dim: 6 };
        assert!(KvCache::with_values(KvType::F32, 1, 1, (1, 8), past).is_err());
    }
}
