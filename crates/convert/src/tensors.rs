//! Tensor data: the byte-level layout changes llama.cpp's converter makes (Q/K row
//! permutation, stacking experts, splitting fused gate/up) and the output type of each
//! tensor.
//!
//! Layout changes are row moves, done on the stored bytes in the stored dtype, so a tensor
//! whose type does not change is never decoded; a tensor whose bytes do not move either is
//! borrowed straight from the memory-mapped checkpoint. Type changes decode the float
//! dtypes with ferrite-quant (safetensors F32/F16/BF16 are byte-identical to GGML's) and
//! encode with its quantizers.

use std::borrow::Cow;

use ferrite_arch::{GlobalTensor, Kind, TensorName, TensorRole};
use ferrite_gguf::GgmlType;
use ferrite_safetensors::Dtype;

use crate::{ConvertError, OutType};

/// The GGML type with the same little-endian layout as a safetensors float dtype.
pub(crate) fn ggml_of(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// llama.cpp's Q/K permutation: within each head of `rows / n_head` rows, the two halves
/// (rotate-half pairs `i` and `i + d/2`) are interleaved so pair `i` becomes rows `2i, 2i+1`.
/// New row `h·d + 2j + i` is old row `h·d + i·d/2 + j`.
pub(crate) fn permute_rows(bytes: &[u8], rows: usize, n_head: usize) -> Vec<u8> {
    let row_bytes = bytes.len() / rows;
    let head = rows / n_head;
    let half = head / 2;
    let mut out = Vec::with_capacity(bytes.len());
    for h in 0..n_head {
        for j in 0..half {
            for i in 0..2 {
                let src = h * head + i * half + j;
                out.extend_from_slice(&bytes[src * row_bytes..(src + 1) * row_bytes]);
            }
        }
    }
    out
}

/// Rows `[from, to)` of every one of `blocks` equal blocks of `block_rows` rows each,
/// concatenated: one half of a fused `[experts, 2·ff, d]` gate/up tensor.
pub(crate) fn slice_rows_per_block(
    bytes: &[u8],
    blocks: usize,
    block_rows: usize,
    from: usize,
    to: usize,
) -> Vec<u8> {
    let row_bytes = bytes.len() / (blocks * block_rows);
    let mut out = Vec::with_capacity(blocks * (to - from) * row_bytes);
    for b in 0..blocks {
        let start = (b * block_rows + from) * row_bytes;
        let end = (b * block_rows + to) * row_bytes;
        out.extend_from_slice(&bytes[start..end]);
    }
    out
}

/// Of each of the `blocks` row-major `rows × cols` matrices of `elem`-byte values, every
/// second column from column `first` (gpt-oss's interleaved gate and up), written as the
/// rows of a `cols / 2 × rows` matrix (transposed).
pub(crate) fn transposed_columns(
    bytes: &[u8],
    (blocks, rows, cols): (usize, usize, usize),
    first: usize,
    elem: usize,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() / 2);
    for b in 0..blocks {
        for c in (first..cols).step_by(2) {
            for r in 0..rows {
                let at = ((b * rows + r) * cols + c) * elem;
                out.extend_from_slice(&bytes[at..at + elem]);
            }
        }
    }
    out
}

/// Each of `blocks` row-major `rows × cols` matrices of `elem`-byte values (cols from the
/// bytes) transposed in place of itself: `cols × rows`.
pub(crate) fn transpose_blocks(bytes: &[u8], blocks: usize, rows: usize, elem: usize) -> Vec<u8> {
    let per = bytes.len() / blocks.max(1);
    let cols = per / (rows * elem).max(1);
    let mut out = vec![0u8; bytes.len()];
    for b in 0..blocks {
        for r in 0..rows {
            for c in 0..cols {
                let from = b * per + (r * cols + c) * elem;
                let to = b * per + (c * rows + r) * elem;
                out[to..to + elem].copy_from_slice(&bytes[from..from + elem]);
            }
        }
    }
    out
}

/// The type llama.cpp's converter gives a tensor: vectors, norms, routers and biases stay
/// F32; matrices take the requested type, Q8_0 falling back to F16 for rows that are not a
/// whole number of blocks; `Stored` keeps the stored float type.
pub(crate) fn target_type(gguf_name: &str, shape: &[u64], out: OutType, src: GgmlType) -> GgmlType {
    // Every name here comes from the architecture table (`names::map`).
    let keep_f32 = shape.len() <= 1
        || match TensorName::parse(gguf_name) {
            Some(TensorName::Global(g)) => g == GlobalTensor::OutputNorm,
            Some(TensorName::Layer { role, kind, .. }) => {
                kind == Kind::Bias || role.is_norm() || role == TensorRole::FfnGateInp
            }
            None => false,
        };
    if keep_f32 {
        return GgmlType::F32;
    }
    let row = shape.last().copied().unwrap_or(1);
    match out {
        OutType::F32 => GgmlType::F32,
        OutType::F16 => GgmlType::F16,
        OutType::BF16 => GgmlType::BF16,
        OutType::Q8_0 if row % GgmlType::Q8_0.block_size() == 0 => GgmlType::Q8_0,
        OutType::Q8_0 => GgmlType::F16,
        OutType::Stored => src,
    }
}

/// `1 + w` of every value of `bytes` (stored as `src`), as f32 bytes: Gemma's norm weights.
pub(crate) fn plus_one(
    gguf_name: &str,
    src: GgmlType,
    bytes: &[u8],
) -> Result<Vec<u8>, ConvertError> {
    map_values(gguf_name, src, bytes, |v| v + 1.0)
}

/// `f` of every value of `bytes` (stored as `src`), as f32 bytes.
pub(crate) fn map_values(
    gguf_name: &str,
    src: GgmlType,
    bytes: &[u8],
    f: impl Fn(f32) -> f32,
) -> Result<Vec<u8>, ConvertError> {
    let n = (bytes.len() as u64 / src.type_size()) as usize;
    let mut values = vec![0f32; n];
    ferrite_quant::dequantize(src, bytes, &mut values).map_err(|source| ConvertError::Quant {
        tensor: gguf_name.to_owned(),
        source,
    })?;
    Ok(values.iter().flat_map(|&v| f(v).to_le_bytes()).collect())
}

/// Re-encodes `bytes` (stored as `src`) as `target`; borrowed bytes pass through untouched
/// when the type does not change.
pub(crate) fn encode<'a>(
    gguf_name: &str,
    src: GgmlType,
    bytes: Cow<'a, [u8]>,
    target: GgmlType,
) -> Result<Cow<'a, [u8]>, ConvertError> {
    if src == target {
        return Ok(bytes);
    }
    let quant = |source| ConvertError::Quant {
        tensor: gguf_name.to_owned(),
        source,
    };
    let n = (bytes.len() as u64 / src.type_size()) as usize;
    let mut values = vec![0f32; n];
    ferrite_quant::dequantize(src, &bytes, &mut values).map_err(quant)?;
    let len = target
        .row_bytes(n as u64)
        .ok_or_else(|| ConvertError::BadTensor {
            tensor: gguf_name.to_owned(),
            reason: format!("{n} values do not fill whole {target:?} blocks"),
        })?;
    let mut out = vec![0u8; len as usize];
    ferrite_quant::quantize(target, &values, &mut out).map_err(quant)?;
    Ok(Cow::Owned(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_interleaves_halves_within_each_head() {
        // Two heads of four one-byte rows: [a0 a1 b0 b1] -> [a0 b0 a1 b1].
        let rows = [0u8, 1, 2, 3, 10, 11, 12, 13];
        assert_eq!(permute_rows(&rows, 8, 2), [0, 2, 1, 3, 10, 12, 11, 13]);
    }

    #[test]
    fn fused_gate_up_halves() {
        // Two experts, 2·ff = 4 rows of 1 byte each.
        let b = [0u8, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(slice_rows_per_block(&b, 2, 4, 0, 2), [0, 1, 4, 5]);
        assert_eq!(slice_rows_per_block(&b, 2, 4, 2, 4), [2, 3, 6, 7]);
    }

    #[test]
    fn gpt_oss_interleaved_columns_transposed() {
        // Two experts of 2 rows × 4 one-byte columns (g0 u0 g1 u1).
        let b = [0u8, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23, 30, 31, 32, 33];
        // Gate: columns 0 and 2 of each expert, as rows of the transposed matrix.
        assert_eq!(
            transposed_columns(&b, (2, 2, 4), 0, 1),
            [0, 10, 2, 12, 20, 30, 22, 32]
        );
        assert_eq!(
            transposed_columns(&b, (2, 2, 4), 1, 1),
            [1, 11, 3, 13, 21, 31, 23, 33]
        );
    }

    #[test]
    fn type_rules_match_llama_cpp() {
        let t = |name: &str, shape: &[u64], out| target_type(name, shape, out, GgmlType::BF16);
        assert_eq!(
            t("blk.0.attn_q.weight", &[64, 64], OutType::Q8_0),
            GgmlType::Q8_0
        );
        assert_eq!(
            t("blk.0.attn_q.weight", &[64, 48], OutType::Q8_0),
            GgmlType::F16
        );
        assert_eq!(t("blk.0.attn_q.bias", &[64], OutType::F16), GgmlType::F32);
        assert_eq!(
            t("blk.0.attn_q_norm.weight", &[64], OutType::F16),
            GgmlType::F32
        );
        assert_eq!(
            t("blk.0.ffn_gate_inp.weight", &[4, 64], OutType::F16),
            GgmlType::F32
        );
        assert_eq!(
            t("token_embd.weight", &[10, 64], OutType::Stored),
            GgmlType::BF16
        );
    }
}
