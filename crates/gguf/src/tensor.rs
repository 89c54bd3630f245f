//! Tensor infos and the checks on them: a shape must be 1 to 4 nonzero dimensions whose
//! row length is a whole number of blocks and whose byte size fits in 64 bits; data ranges
//! must be aligned, inside the data section and pairwise disjoint.
//!
//! Both the reader and the writer go through these checks, so the writer cannot produce a
//! file the reader would refuse.

use crate::{GgmlType, GgufError};

/// Most dimensions a GGUF tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;

/// One tensor's entry in the file's tensor table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in GGUF order: `dims[0]` is the row length (ggml's `ne0`), the fastest
    /// varying index. 1 to 4 entries, none zero.
    pub dims: Vec<u64>,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
}

impl TensorInfo {
    /// Builds an info after checking the shape against the type; `n_bytes` is derived.
    pub fn new(name: String, ty: GgmlType, dims: Vec<u64>, offset: u64) -> Result<Self, GgufError> {
        let n_bytes = checked_n_bytes(&name, ty, &dims)?;
        Ok(TensorInfo {
            name,
            ty,
            dims,
            offset,
            n_bytes,
        })
    }

    /// Number of elements (product of the dimensions). Cannot overflow: construction
    /// checked it.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Byte size of a tensor of type `ty` and shape `dims`, or the reason there is none.
pub(crate) fn checked_n_bytes(name: &str, ty: GgmlType, dims: &[u64]) -> Result<u64, GgufError> {
    if dims.is_empty() || dims.len() > MAX_DIMS || dims.contains(&0) {
        return Err(GgufError::BadDims {
            tensor: name.to_owned(),
            dims: dims.to_vec(),
        });
    }
    let overflow = || GgufError::SizeOverflow {
        tensor: name.to_owned(),
        dims: dims.to_vec(),
    };
    let mut n_elements: u64 = 1;
    for &d in dims {
        n_elements = n_elements.checked_mul(d).ok_or_else(overflow)?;
    }
    let row = dims[0];
    if !row.is_multiple_of(ty.block_size()) {
        return Err(GgufError::PartialBlock {
            tensor: name.to_owned(),
            ty,
            row,
            block: ty.block_size(),
        });
    }
    (n_elements / ty.block_size())
        .checked_mul(ty.type_size())
        .ok_or_else(overflow)
}

/// Checks that every tensor's data is aligned, lies inside a data section of `data_size`
/// bytes, and overlaps no other tensor's data.
pub(crate) fn check_layout(
    tensors: &[TensorInfo],
    alignment: u64,
    data_size: u64,
) -> Result<(), GgufError> {
    for t in tensors {
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::UnalignedTensor {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let in_bounds = t
            .offset
            .checked_add(t.n_bytes)
            .is_some_and(|end| end <= data_size);
        if !in_bounds {
            return Err(GgufError::TensorOutOfBounds {
                tensor: t.name.clone(),
                offset: t.offset,
                n_bytes: t.n_bytes,
                data_size,
            });
        }
    }
    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset);
    for pair in by_offset.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        // In bounds was checked above, so this sum cannot overflow.
        if a.offset + a.n_bytes > b.offset {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                second: b.name.clone(),
                offset: b.offset,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(name: &str, ty: GgmlType, dims: &[u64], offset: u64) -> TensorInfo {
        TensorInfo::new(name.to_owned(), ty, dims.to_vec(), offset).expect("valid shape")
    }

    #[test]
    fn sizes_follow_the_type_table() {
        assert_eq!(info("a", GgmlType::F32, &[3, 2], 0).n_bytes, 24);
        assert_eq!(info("a", GgmlType::Q4_K, &[512, 3], 0).n_bytes, 3 * 288);
        assert_eq!(
            info("a", GgmlType::Q8_0, &[64, 2, 2, 2], 0).n_elements(),
            512
        );
    }

    #[test]
    fn rejects_bad_shapes() {
        let err = |dims: &[u64], ty| TensorInfo::new("t".into(), ty, dims.to_vec(), 0).unwrap_err();
        assert!(matches!(err(&[], GgmlType::F32), GgufError::BadDims { .. }));
        assert!(matches!(
            err(&[1, 1, 1, 1, 1], GgmlType::F32),
            GgufError::BadDims { .. }
        ));
        assert!(matches!(
            err(&[4, 0], GgmlType::F32),
            GgufError::BadDims { .. }
        ));
        assert!(matches!(
            err(&[u64::MAX, 2], GgmlType::F32),
            GgufError::SizeOverflow { .. }
        ));
        // Element count fits, byte size does not.
        assert!(matches!(
            err(&[1 << 62, 1], GgmlType::F32),
            GgufError::SizeOverflow { .. }
        ));
        assert!(matches!(
            err(&[100], GgmlType::Q4_K),
            GgufError::PartialBlock {
                row: 100,
                block: 256,
                ..
            }
        ));
    }

    #[test]
    fn layout_checks_alignment_bounds_and_overlap() {
        let a = info("a", GgmlType::F32, &[8], 0);
        let b = info("b", GgmlType::F32, &[8], 32);
        assert!(check_layout(&[a.clone(), b.clone()], 32, 64).is_ok());
        assert!(matches!(
            check_layout(&[a.clone(), b.clone()], 32, 63).unwrap_err(),
            GgufError::TensorOutOfBounds { .. }
        ));
        let unaligned = info("u", GgmlType::F32, &[8], 16);
        assert!(matches!(
            check_layout(&[unaligned], 32, 64).unwrap_err(),
            GgufError::UnalignedTensor { offset: 16, .. }
        ));
        let big = info("big", GgmlType::F32, &[9], 0);
        let err = check_layout(&[b, big], 32, 128).unwrap_err();
        assert!(
            matches!(&err, GgufError::OverlappingTensors { first, second, offset: 32 }
                if first == "big" && second == "b"),
            "{err}"
        );
    }
}
