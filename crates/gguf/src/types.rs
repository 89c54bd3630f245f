//! The GGML tensor type table: type id, name, block size and bytes per block.
//!
//! This is the one place that maps GGUF type ids to their storage layout. It knows nothing
//! about how a block is decoded; that belongs to `ferrite-quant`.
//!
//! Layouts follow ggml's `type_traits` table (ggml-org/ggml `src/ggml.c`, `src/ggml-common.h`).

/// A tensor element type as stored in GGUF files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[allow(non_camel_case_types)]
pub enum GgmlType {
    /// 32-bit IEEE float.
    F32,
    /// 16-bit IEEE float.
    F16,
    /// 32 weights: f16 scale, 16 bytes of 4-bit quants.
    Q4_0,
    /// 32 weights: f16 scale and min, 16 bytes of 4-bit quants.
    Q4_1,
    /// 32 weights: f16 scale, 4 bytes of high bits, 16 bytes of low nibbles.
    Q5_0,
    /// 32 weights: f16 scale and min, 4 bytes of high bits, 16 bytes of low nibbles.
    Q5_1,
    /// 32 weights: f16 scale, 32 signed bytes.
    Q8_0,
    /// 32 weights: f16 scale, f16 sum, 32 signed bytes (activation format).
    Q8_1,
    /// 256-weight super-block, 2-bit quants.
    Q2_K,
    /// 256-weight super-block, 3-bit quants.
    Q3_K,
    /// 256-weight super-block, 4-bit quants, 6-bit sub-block scales and mins.
    Q4_K,
    /// 256-weight super-block, 5-bit quants.
    Q5_K,
    /// 256-weight super-block, 6-bit quants, 8-bit sub-block scales.
    Q6_K,
    /// 256-weight super-block of 8-bit quants with f32 scale and block sums (activations).
    Q8_K,
    /// 2.06 bits per weight importance-matrix format.
    IQ2_XXS,
    /// 2.31 bits per weight importance-matrix format.
    IQ2_XS,
    /// 3.06 bits per weight importance-matrix format.
    IQ3_XXS,
    /// 1.56 bits per weight importance-matrix format.
    IQ1_S,
    /// 32 weights: f16 scale, 16 bytes of 4-bit indices into a non-linear table.
    IQ4_NL,
    /// 3.44 bits per weight importance-matrix format.
    IQ3_S,
    /// 2.5 bits per weight importance-matrix format.
    IQ2_S,
    /// 256-weight super-block of IQ4_NL-style indices with 6-bit sub-block scales.
    IQ4_XS,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// 64-bit IEEE float.
    F64,
    /// 1.75 bits per weight importance-matrix format.
    IQ1_M,
    /// bfloat16.
    BF16,
    /// Ternary, 1.69 bits per weight.
    TQ1_0,
    /// Ternary, 2.06 bits per weight.
    TQ2_0,
    /// 32 weights: e8m0 shared exponent, 16 bytes of fp4 (e2m1) values.
    MXFP4,
}

/// Every known type, in id order.
pub const ALL_TYPES: [GgmlType; 32] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ2_XXS,
    GgmlType::IQ2_XS,
    GgmlType::IQ3_XXS,
    GgmlType::IQ1_S,
    GgmlType::IQ4_NL,
    GgmlType::IQ3_S,
    GgmlType::IQ2_S,
    GgmlType::IQ4_XS,
    GgmlType::I8,
    GgmlType::I16,
    GgmlType::I32,
    GgmlType::I64,
    GgmlType::F64,
    GgmlType::IQ1_M,
    GgmlType::BF16,
    GgmlType::TQ1_0,
    GgmlType::TQ2_0,
    GgmlType::MXFP4,
];

impl GgmlType {
    /// (GGUF id, name, values per block, bytes per block).
    const fn traits(self) -> (u32, &'static str, u64, u64) {
        use GgmlType::*;
        match self {
            F32 => (0, "F32", 1, 4),
            F16 => (1, "F16", 1, 2),
            Q4_0 => (2, "Q4_0", 32, 18),
            Q4_1 => (3, "Q4_1", 32, 20),
            Q5_0 => (6, "Q5_0", 32, 22),
            Q5_1 => (7, "Q5_1", 32, 24),
            Q8_0 => (8, "Q8_0", 32, 34),
            Q8_1 => (9, "Q8_1", 32, 36),
            Q2_K => (10, "Q2_K", 256, 84),
            Q3_K => (11, "Q3_K", 256, 110),
            Q4_K => (12, "Q4_K", 256, 144),
            Q5_K => (13, "Q5_K", 256, 176),
            Q6_K => (14, "Q6_K", 256, 210),
            Q8_K => (15, "Q8_K", 256, 292),
            IQ2_XXS => (16, "IQ2_XXS", 256, 66),
            IQ2_XS => (17, "IQ2_XS", 256, 74),
            IQ3_XXS => (18, "IQ3_XXS", 256, 98),
            IQ1_S => (19, "IQ1_S", 256, 50),
            IQ4_NL => (20, "IQ4_NL", 32, 18),
            IQ3_S => (21, "IQ3_S", 256, 110),
            IQ2_S => (22, "IQ2_S", 256, 82),
            IQ4_XS => (23, "IQ4_XS", 256, 136),
            I8 => (24, "I8", 1, 1),
            I16 => (25, "I16", 1, 2),
            I32 => (26, "I32", 1, 4),
            I64 => (27, "I64", 1, 8),
            F64 => (28, "F64", 1, 8),
            IQ1_M => (29, "IQ1_M", 256, 56),
            BF16 => (30, "BF16", 1, 2),
            TQ1_0 => (34, "TQ1_0", 256, 54),
            TQ2_0 => (35, "TQ2_0", 256, 66),
            MXFP4 => (39, "MXFP4", 32, 17),
        }
    }

    /// The type with GGUF id `id`, if ferrite knows it.
    pub fn from_id(id: u32) -> Option<Self> {
        ALL_TYPES.iter().copied().find(|t| t.id() == id)
    }

    /// The type whose GGML name is `name` (case-insensitive), if any.
    pub fn from_name(name: &str) -> Option<Self> {
        ALL_TYPES
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(name))
    }

    /// The GGUF type id.
    pub const fn id(self) -> u32 {
        self.traits().0
    }

    /// The GGML name, e.g. `Q4_K`.
    pub const fn name(self) -> &'static str {
        self.traits().1
    }

    /// Number of values in one block.
    pub const fn block_size(self) -> u64 {
        self.traits().2
    }

    /// Number of bytes in one block.
    pub const fn type_size(self) -> u64 {
        self.traits().3
    }

    /// Bytes needed for a row of `n` values, or `None` when `n` is not a whole number of
    /// blocks or the size overflows.
    pub fn row_bytes(self, n: u64) -> Option<u64> {
        if !n.is_multiple_of(self.block_size()) {
            return None;
        }
        (n / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_are_unique() {
        for t in ALL_TYPES {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
            assert_eq!(GgmlType::from_name(t.name()), Some(t));
        }
        let mut ids: Vec<u32> = ALL_TYPES.iter().map(|t| t.id()).collect();
        ids.dedup();
        assert_eq!(ids.len(), ALL_TYPES.len());
        assert_eq!(GgmlType::from_id(4), None, "Q4_2 was removed from ggml");
    }

    #[test]
    fn row_bytes_requires_whole_blocks() {
        assert_eq!(GgmlType::Q4_K.row_bytes(512), Some(288));
        assert_eq!(GgmlType::Q4_K.row_bytes(100), None);
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
    }
}
