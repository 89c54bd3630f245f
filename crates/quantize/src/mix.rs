//! [`Mix`]: the named output types of `ferrite quantize` (llama.cpp's "file types"), their
//! default tensor type and the `general.file_type` code written for them.

use ferrite_gguf::GgmlType;

/// A named quantization mix: one default tensor type plus the per-tensor rule of
/// [`crate::rule`] (which promotes some tensors, e.g. `output.weight`, to more bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
#[non_exhaustive]
pub enum Mix {
    /// Every weight matrix F32.
    F32,
    /// Every weight matrix F16.
    F16,
    /// Every weight matrix BF16.
    BF16,
    /// Q8_0 (8.5 bits per weight).
    Q8_0,
    /// Q4_0 matrices, Q6_K output head.
    Q4_0,
    /// Q4_1 matrices, Q6_K output head.
    Q4_1,
    /// Q5_0 matrices, Q6_K output head.
    Q5_0,
    /// Q5_1 matrices, Q6_K output head.
    Q5_1,
    /// Q4_K matrices; Q6_K output head and Q6_K `attn_v`/`ffn_down` in "more bits" layers.
    Q4_K_M,
    /// Q5_K matrices; Q6_K output head and Q6_K `attn_v`/`ffn_down` in "more bits" layers.
    Q5_K_M,
    /// Q6_K matrices.
    Q6_K,
}

impl Mix {
    /// Every mix, in the order `--help` lists them.
    pub const ALL: [Mix; 11] = [
        Mix::Q8_0,
        Mix::Q4_0,
        Mix::Q4_1,
        Mix::Q5_0,
        Mix::Q5_1,
        Mix::Q4_K_M,
        Mix::Q5_K_M,
        Mix::Q6_K,
        Mix::F16,
        Mix::BF16,
        Mix::F32,
    ];

    /// The lower-case name used on the command line, e.g. `q4_k_m`.
    pub const fn name(self) -> &'static str {
        match self {
            Mix::F32 => "f32",
            Mix::F16 => "f16",
            Mix::BF16 => "bf16",
            Mix::Q8_0 => "q8_0",
            Mix::Q4_0 => "q4_0",
            Mix::Q4_1 => "q4_1",
            Mix::Q5_0 => "q5_0",
            Mix::Q5_1 => "q5_1",
            Mix::Q4_K_M => "q4_k_m",
            Mix::Q5_K_M => "q5_k_m",
            Mix::Q6_K => "q6_k",
        }
    }

    /// The mix named `name` (case-insensitive; `-` and `_` are interchangeable).
    pub fn from_name(name: &str) -> Option<Mix> {
        let norm = name.trim().replace('-', "_");
        Mix::ALL
            .into_iter()
            .find(|m| m.name().eq_ignore_ascii_case(&norm))
    }

    /// The type a weight matrix gets when no special rule applies.
    pub const fn default_type(self) -> GgmlType {
        match self {
            Mix::F32 => GgmlType::F32,
            Mix::F16 => GgmlType::F16,
            Mix::BF16 => GgmlType::BF16,
            Mix::Q8_0 => GgmlType::Q8_0,
            Mix::Q4_0 => GgmlType::Q4_0,
            Mix::Q4_1 => GgmlType::Q4_1,
            Mix::Q5_0 => GgmlType::Q5_0,
            Mix::Q5_1 => GgmlType::Q5_1,
            Mix::Q4_K_M => GgmlType::Q4_K,
            Mix::Q5_K_M => GgmlType::Q5_K,
            Mix::Q6_K => GgmlType::Q6_K,
        }
    }

    /// Whether the mix stores weights in a block-quantized format (the per-tensor promotions
    /// and block-size fallbacks apply only then).
    pub const fn is_quantized(self) -> bool {
        !matches!(self, Mix::F32 | Mix::F16 | Mix::BF16)
    }

    /// The value written to `general.file_type`: llama.cpp's `llama_ftype` code of the mix
    /// (`LLAMA_FTYPE_ALL_F32` = 0, `MOSTLY_F16` = 1, `MOSTLY_Q4_0` = 2, `MOSTLY_Q4_1` = 3,
    /// `MOSTLY_Q8_0` = 7, `MOSTLY_Q5_0` = 8, `MOSTLY_Q5_1` = 9, `MOSTLY_Q4_K_M` = 15,
    /// `MOSTLY_Q5_K_M` = 17, `MOSTLY_Q6_K` = 18, `MOSTLY_BF16` = 32).
    pub const fn file_type(self) -> u32 {
        match self {
            Mix::F32 => 0,
            Mix::F16 => 1,
            Mix::Q4_0 => 2,
            Mix::Q4_1 => 3,
            Mix::Q8_0 => 7,
            Mix::Q5_0 => 8,
            Mix::Q5_1 => 9,
            Mix::Q4_K_M => 15,
            Mix::Q5_K_M => 17,
            Mix::Q6_K => 18,
            Mix::BF16 => 32,
        }
    }
}

impl std::fmt::Display for Mix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Mix {
    type Err = crate::QuantizeError;

    fn from_str(s: &str) -> Result<Mix, Self::Err> {
        Mix::from_name(s).ok_or_else(|| crate::QuantizeError::UnknownMix { name: s.to_owned() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_accept_case_and_dashes() {
        for m in Mix::ALL {
            assert_eq!(Mix::from_name(m.name()), Some(m));
        }
        assert_eq!(Mix::from_name("Q4_K_M"), Some(Mix::Q4_K_M));
        assert_eq!(Mix::from_name("q5-k-m"), Some(Mix::Q5_K_M));
        assert_eq!(Mix::from_name("q4_k"), None);
        assert!("q3_k_s".parse::<Mix>().is_err());
    }

    #[test]
    fn file_type_codes_are_distinct() {
        let mut codes: Vec<u32> = Mix::ALL.iter().map(|m| m.file_type()).collect();
        codes.sort_unstable();
        codes.dedup();
        assert_eq!(codes.len(), Mix::ALL.len());
    }
}
