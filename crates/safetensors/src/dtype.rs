//! [`Dtype`]: the element types a safetensors header may name, and their sizes.
//!
//! The names are the ones the safetensors format defines (`F32`, `BF16`, ...). Any other
//! name is refused when the header is parsed, so a tensor's byte size is always known.

/// Element type of a safetensors tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Dtype {
    /// Boolean, one byte.
    Bool,
    /// Unsigned 8-bit integer.
    U8,
    /// Signed 8-bit integer.
    I8,
    /// 8-bit float, 5 exponent bits.
    F8E5M2,
    /// 8-bit float, 4 exponent bits.
    F8E4M3,
    /// Signed 16-bit integer.
    I16,
    /// Unsigned 16-bit integer.
    U16,
    /// IEEE half.
    F16,
    /// bfloat16.
    BF16,
    /// Signed 32-bit integer.
    I32,
    /// Unsigned 32-bit integer.
    U32,
    /// IEEE single.
    F32,
    /// IEEE double.
    F64,
    /// Signed 64-bit integer.
    I64,
    /// Unsigned 64-bit integer.
    U64,
}

impl Dtype {
    /// Every dtype with its header name.
    const TABLE: [(Dtype, &'static str, u64); 15] = [
        (Dtype::Bool, "BOOL", 1),
        (Dtype::U8, "U8", 1),
        (Dtype::I8, "I8", 1),
        (Dtype::F8E5M2, "F8_E5M2", 1),
        (Dtype::F8E4M3, "F8_E4M3", 1),
        (Dtype::I16, "I16", 2),
        (Dtype::U16, "U16", 2),
        (Dtype::F16, "F16", 2),
        (Dtype::BF16, "BF16", 2),
        (Dtype::I32, "I32", 4),
        (Dtype::U32, "U32", 4),
        (Dtype::F32, "F32", 4),
        (Dtype::F64, "F64", 8),
        (Dtype::I64, "I64", 8),
        (Dtype::U64, "U64", 8),
    ];

    /// The dtype a header names, if the format defines it.
    pub fn from_name(name: &str) -> Option<Dtype> {
        Self::TABLE
            .iter()
            .find(|(_, n, _)| *n == name)
            .map(|(d, _, _)| *d)
    }

    /// The header name (`"BF16"`).
    pub fn name(self) -> &'static str {
        Self::TABLE
            .iter()
            .find(|(d, _, _)| *d == self)
            .map_or("?", |(_, n, _)| n)
    }

    /// Bytes per element.
    pub fn size(self) -> u64 {
        Self::TABLE
            .iter()
            .find(|(d, _, _)| *d == self)
            .map_or(1, |(_, _, s)| *s)
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_sizes_match_the_format() {
        for (d, name, size) in Dtype::TABLE {
            assert_eq!(Dtype::from_name(name), Some(d));
            assert_eq!(d.name(), name);
            assert_eq!(d.size(), size);
        }
        assert_eq!(Dtype::from_name("f32"), None, "names are case-sensitive");
        assert_eq!(Dtype::from_name("Q4_0"), None);
    }
}
