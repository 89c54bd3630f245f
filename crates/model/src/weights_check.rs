//! Load-time checks of weight values and types that the shape checks cannot see: non-finite
//! numbers (a NaN weight otherwise surfaces as "logit 0 is NaN" at the first token, naming
//! no tensor) and 1-D tensors of a type no GGUF writer produces.
//!
//! The cheap checks run on every load: every 1-D tensor (norms, biases, rope factors: small)
//! is F32 and finite, and every block scale of the quantized matrices is finite (two to four
//! bytes per block, read in place). The full scan of every value of every tensor
//! ([`check_weights`], `--check-weights`) dequantizes the large matrices too, so it costs a
//! pass over the whole file; it is asked for, never implied. Neither may copy a matrix whole.

use std::mem::{offset_of, size_of};

use ferrite_gguf::{GgmlType, Gguf, TensorInfo};
use ferrite_quant::{
    BlockIq4Nl, BlockIq4Xs, BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0,
    BlockQ5_1, BlockQ5K, BlockQ6K, BlockQ8_0, BlockQ8K, BlockTq10, BlockTq20,
};

use crate::ModelError;

/// How a block scale is stored.
#[derive(Clone, Copy)]
enum Scale {
    F16(usize),
    F32(usize),
}

/// The block size in bytes and the byte offsets of the float scales of a block of `ty`,
/// taken from ferrite-quant's block structs; `None` for types without float block scales
/// (plain floats, whose values the full scan checks, and MXFP4, whose e8m0 exponent is
/// finite for every byte).
fn block_scales(ty: GgmlType) -> Option<(usize, Vec<Scale>)> {
    use Scale::{F16, F32};
    Some(match ty {
        GgmlType::Q4_0 => (size_of::<BlockQ4_0>(), vec![F16(offset_of!(BlockQ4_0, d))]),
        GgmlType::Q4_1 => (
            size_of::<BlockQ4_1>(),
            vec![F16(offset_of!(BlockQ4_1, d)), F16(offset_of!(BlockQ4_1, m))],
        ),
        GgmlType::Q5_0 => (size_of::<BlockQ5_0>(), vec![F16(offset_of!(BlockQ5_0, d))]),
        GgmlType::Q5_1 => (
            size_of::<BlockQ5_1>(),
            vec![F16(offset_of!(BlockQ5_1, d)), F16(offset_of!(BlockQ5_1, m))],
        ),
        GgmlType::Q8_0 => (size_of::<BlockQ8_0>(), vec![F16(offset_of!(BlockQ8_0, d))]),
        GgmlType::Q2_K => (
            size_of::<BlockQ2K>(),
            vec![
                F16(offset_of!(BlockQ2K, d)),
                F16(offset_of!(BlockQ2K, dmin)),
            ],
        ),
        GgmlType::Q3_K => (size_of::<BlockQ3K>(), vec![F16(offset_of!(BlockQ3K, d))]),
        GgmlType::Q4_K => (
            size_of::<BlockQ4K>(),
            vec![
                F16(offset_of!(BlockQ4K, d)),
                F16(offset_of!(BlockQ4K, dmin)),
            ],
        ),
        GgmlType::Q5_K => (
            size_of::<BlockQ5K>(),
            vec![
                F16(offset_of!(BlockQ5K, d)),
                F16(offset_of!(BlockQ5K, dmin)),
            ],
        ),
        GgmlType::Q6_K => (size_of::<BlockQ6K>(), vec![F16(offset_of!(BlockQ6K, d))]),
        GgmlType::Q8_K => (size_of::<BlockQ8K>(), vec![F32(offset_of!(BlockQ8K, d))]),
        GgmlType::IQ4_NL => (
            size_of::<BlockIq4Nl>(),
            vec![F16(offset_of!(BlockIq4Nl, d))],
        ),
        GgmlType::IQ4_XS => (
            size_of::<BlockIq4Xs>(),
            vec![F16(offset_of!(BlockIq4Xs, d))],
        ),
        GgmlType::TQ1_0 => (size_of::<BlockTq10>(), vec![F16(offset_of!(BlockTq10, d))]),
        GgmlType::TQ2_0 => (size_of::<BlockTq20>(), vec![F16(offset_of!(BlockTq20, d))]),
        _ => return None,
    })
}

fn non_finite(t: &TensorInfo, index: u64, value: f32) -> ModelError {
    ModelError::NonFiniteWeight {
        name: t.name.clone(),
        index,
        value,
    }
}

/// The cheap checks of every load (module doc).
pub(crate) fn check_at_load(g: &Gguf) -> Result<(), ModelError> {
    for t in g.tensors() {
        if t.dims.len() == 1 {
            check_vector(g, t)?;
        } else if let Some((block, scales)) = block_scales(t.ty) {
            check_scales(t, g.tensor_data(t), block, &scales)?;
        }
    }
    Ok(())
}

/// A 1-D tensor is F32 (llama.cpp's converter and ferrite's convert and quantize keep every
/// vector F32; a header that says otherwise reads the bytes as other numbers) and finite.
fn check_vector(g: &Gguf, t: &TensorInfo) -> Result<(), ModelError> {
    if t.ty != GgmlType::F32 {
        return Err(ModelError::TensorType {
            name: t.name.clone(),
            got: t.ty,
            expected: GgmlType::F32,
        });
    }
    for (i, b) in g.tensor_data(t).chunks_exact(4).enumerate() {
        let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if !v.is_finite() {
            return Err(non_finite(t, i as u64, v));
        }
    }
    Ok(())
}

/// Every scale of every block of `data`; the error names the first value of the block.
fn check_scales(
    t: &TensorInfo,
    data: &[u8],
    block: usize,
    scales: &[Scale],
) -> Result<(), ModelError> {
    let per_block = t.ty.block_size();
    for (i, b) in data.chunks_exact(block).enumerate() {
        for s in scales {
            let v = match *s {
                Scale::F16(o) => half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32(),
                Scale::F32(o) => f32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]),
            };
            if !v.is_finite() {
                return Err(non_finite(t, i as u64 * per_block, v));
            }
        }
    }
    Ok(())
}

/// Rows dequantized at a time by the full scan, bounding its memory.
const SCAN_ROWS: usize = 64;

/// The full scan (`--check-weights`, like llama.cpp's `--check-tensors`): every value of
/// every tensor of `g` is dequantized, a few rows at a time, and must be finite; the error
/// names the tensor and the first bad value's index.
pub fn check_weights(g: &Gguf) -> Result<(), ModelError> {
    for t in g.tensors() {
        let (block, block_bytes) = (t.ty.block_size() as usize, t.ty.type_size() as usize);
        // The reader checked that rows are whole blocks; one block is the floor anyway.
        let row_bytes = t.ty.row_bytes(t.dims[0]).unwrap_or(t.ty.type_size()) as usize;
        let chunk_bytes = row_bytes.saturating_mul(SCAN_ROWS);
        let mut out = vec![0.0f32; chunk_bytes / block_bytes * block];
        for (c, bytes) in g.tensor_data(t).chunks(chunk_bytes).enumerate() {
            let n = bytes.len() / block_bytes * block;
            ferrite_quant::dequantize(t.ty, bytes, &mut out[..n]).map_err(|source| {
                ModelError::Quant {
                    name: t.name.clone(),
                    source,
                }
            })?;
            if let Some(i) = out[..n].iter().position(|v| !v.is_finite()) {
                let first = (c * (chunk_bytes / block_bytes * block)) as u64;
                return Err(non_finite(t, first + i as u64, out[i]));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::tiny_gguf;
    use crate::{LoadOptions, Model};
    use ferrite_gguf::GgufWriter;

    /// `bytes` (a GGUF) with tensor `name`'s type and data replaced by `change`.
    fn rewrite(
        bytes: Vec<u8>,
        name: &str,
        change: impl Fn(GgmlType, &[u8]) -> (GgmlType, Vec<u8>),
    ) -> Gguf {
        let g = Gguf::from_bytes(bytes).unwrap();
        let mut w = GgufWriter::new();
        for (k, v) in g.metadata() {
            w.add_metadata(k.clone(), v.clone()).unwrap();
        }
        for t in g.tensors() {
            let data = g.tensor_data(t);
            let (ty, data) = if t.name == name {
                change(t.ty, data)
            } else {
                (t.ty, data.to_vec())
            };
            w.add_tensor(t.name.clone(), ty, &t.dims, data).unwrap();
        }
        Gguf::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    fn load(g: Gguf) -> Result<Model, ModelError> {
        Model::from_gguf(g, LoadOptions::default())
    }

    fn set_f32(data: &[u8], index: usize, v: f32) -> Vec<u8> {
        let mut d = data.to_vec();
        d[4 * index..4 * index + 4].copy_from_slice(&v.to_le_bytes());
        d
    }

    /// Regression (issue 35): the first norm's type changed from F32 to F16 in the header
    /// loaded (its first half read as f16 numbers) and made text.
    #[test]
    fn a_vector_that_is_not_f32_is_refused_by_name() {
        let name = "blk.0.attn_norm.weight";
        let g = rewrite(tiny_gguf("llama", GgmlType::F32, "", ""), name, |_, d| {
            (GgmlType::F16, d[..d.len() / 2].to_vec())
        });
        let err = load(g).unwrap_err();
        assert!(
            matches!(&err, ModelError::TensorType { name: n, got: GgmlType::F16, .. } if n == name),
            "{err}"
        );
    }

    /// Regression (issue 35): a NaN weight was found only at the first token ("logit 0 is
    /// NaN"), naming no tensor. Norms are checked at every load.
    #[test]
    fn non_finite_norm_values_are_refused_at_load_by_name() {
        for (name, v) in [
            ("output_norm.weight", f32::NAN),
            ("blk.1.ffn_norm.weight", f32::NEG_INFINITY),
        ] {
            let g = rewrite(tiny_gguf("llama", GgmlType::F32, "", ""), name, |ty, d| {
                (ty, set_f32(d, 7, v))
            });
            let err = load(g).unwrap_err();
            assert!(
                matches!(&err, ModelError::NonFiniteWeight { name: n, index: 7, .. } if n == name),
                "{name}: {err}"
            );
        }
    }

    /// A block scale of infinity (f16 0x7c00) or NaN (0x7e00) makes every value of its block
    /// non-finite; the load names the tensor and the block's first value.
    #[test]
    fn non_finite_block_scales_are_refused_at_load_by_name() {
        let name = "blk.1.attn_q.weight";
        for (ty, scale_at) in [
            (GgmlType::Q8_0, offset_of!(BlockQ8_0, d)),
            (GgmlType::Q4_0, offset_of!(BlockQ4_0, d)),
        ] {
            for bits in [0x7c00u16, 0x7e00] {
                let block = ty.type_size() as usize;
                let g = rewrite(tiny_gguf("llama", ty, "", ""), name, |ty, d| {
                    let mut d = d.to_vec();
                    let at = 3 * block + scale_at;
                    d[at..at + 2].copy_from_slice(&bits.to_le_bytes());
                    (ty, d)
                });
                let err = load(g).unwrap_err();
                let first = 3 * ty.block_size();
                assert!(
                    matches!(&err, ModelError::NonFiniteWeight { name: n, index, .. } if n == name && *index == first),
                    "{ty} {bits:#x}: {err}"
                );
            }
        }
        // Every scale field is read: the minimum of Q4_1 too (the tiny model's rows are too
        // short for the 256-value K-quant blocks).
        let g = rewrite(tiny_gguf("llama", GgmlType::Q4_1, "", ""), name, |ty, d| {
            let mut d = d.to_vec();
            let at = offset_of!(BlockQ4_1, m);
            d[at..at + 2].copy_from_slice(&0x7c00u16.to_le_bytes());
            (ty, d)
        });
        assert!(matches!(
            load(g).unwrap_err(),
            ModelError::NonFiniteWeight { index: 0, .. }
        ));
    }

    /// The full scan finds what the load-time checks leave to it: a NaN inside a large
    /// matrix of a plain float type, named with its element index.
    #[test]
    fn the_full_scan_names_a_non_finite_matrix_value() {
        let name = "blk.1.ffn_down.weight";
        let clean = Gguf::from_bytes(tiny_gguf("llama", GgmlType::F32, "", "")).unwrap();
        check_weights(&clean).unwrap();
        let at = 64 * 70 + 5;
        let g = rewrite(tiny_gguf("llama", GgmlType::F32, "", ""), name, |ty, d| {
            (ty, set_f32(d, at, f32::INFINITY))
        });
        let err = check_weights(&g).unwrap_err();
        assert!(
            matches!(&err, ModelError::NonFiniteWeight { name: n, index, .. } if n == name && *index == at as u64),
            "{err}"
        );
        // The load-time checks do not read matrices of plain floats: the scan is the only
        // thing that finds this one.
        load(g).unwrap();
    }

    /// The scale table agrees with the dequantizer (ferrite-quant, checked bit-exact
    /// against gguf-py): a non-finite value at each listed offset of an otherwise zero block
    /// makes the block dequantize to a non-finite value, and the zero block is finite.
    #[test]
    fn the_scale_offsets_are_the_dequantizers_scales() {
        let types: Vec<GgmlType> = (0..64).filter_map(GgmlType::from_id).collect();
        let mut checked = 0;
        for ty in types {
            let Some((block, scales)) = block_scales(ty) else {
                continue;
            };
            assert_eq!(block as u64, ty.type_size(), "{ty}");
            let mut out = vec![0.0f32; ty.block_size() as usize];
            ferrite_quant::dequantize(ty, &vec![0u8; block], &mut out).unwrap();
            assert!(out.iter().all(|v| v.is_finite()), "{ty}");
            for s in scales {
                let mut b = vec![0u8; block];
                match s {
                    Scale::F16(o) => b[o..o + 2].copy_from_slice(&0x7c00u16.to_le_bytes()),
                    Scale::F32(o) => b[o..o + 4].copy_from_slice(&f32::INFINITY.to_le_bytes()),
                }
                ferrite_quant::dequantize(ty, &b, &mut out).unwrap();
                assert!(out.iter().any(|v| !v.is_finite()), "{ty}");
                checked += 1;
            }
        }
        assert_eq!(checked, 20, "every scale of the 15 block types");
    }
}
