//! Shared by the integration tests: a small valid sample file, a raw byte builder for
//! hand-crafting malformed files, and a deterministic PRNG for mutation testing.

#![allow(dead_code)] // Each test binary uses a different subset.

use ferrite_gguf::{Array, GgmlType, GgufWriter, Value};

/// Offset of the first metadata key: magic (4) + version (4) + tensor count (8) + kv count (8).
pub const FIRST_KEY_OFFSET: u64 = 24;

/// A small valid file exercising every value type, nested arrays and several tensor types.
pub fn sample_writer() -> GgufWriter<'static> {
    let mut w = GgufWriter::new();
    let entries = [
        ("general.architecture", Value::String("llama".into())),
        ("general.name", Value::String("tiny ✓".into())),
        ("u8", Value::U8(200)),
        ("i8", Value::I8(-5)),
        ("u16", Value::U16(60000)),
        ("i16", Value::I16(-30000)),
        ("u32", Value::U32(4_000_000_000)),
        ("i32", Value::I32(-2_000_000_000)),
        ("f32", Value::F32(0.25)),
        ("bool", Value::Bool(true)),
        ("u64", Value::U64(u64::MAX)),
        ("i64", Value::I64(i64::MIN)),
        ("f64", Value::F64(1e-300)),
        (
            "tokens",
            Value::Array(Array::String(
                ["<s>", "</s>", "hello", ""].into_iter().collect(),
            )),
        ),
        ("scores", Value::Array(Array::F32(vec![-1.5, 0.0]))),
        ("types", Value::Array(Array::I32(vec![1, -3]))),
        (
            "nested",
            Value::Array(Array::Array(vec![
                Array::U16(vec![1, 2]),
                Array::String(["x"].into_iter().collect()),
                Array::Bool(vec![]),
            ])),
        ),
        ("empty", Value::Array(Array::U8(vec![]))),
    ];
    for (k, v) in entries {
        w.add_metadata(k, v).expect("valid sample metadata");
    }
    let tensors: [(&str, GgmlType, &[u64]); 4] = [
        ("token_embd.weight", GgmlType::Q8_0, &[64, 3]),
        ("blk.0.attn_norm.weight", GgmlType::F32, &[5]),
        ("blk.0.ffn_down.weight", GgmlType::Q4_K, &[256, 2]),
        ("output.weight", GgmlType::F16, &[3, 2, 1, 2]),
    ];
    for (i, (name, ty, dims)) in tensors.into_iter().enumerate() {
        let n = ty.row_bytes(dims[0]).expect("whole blocks") * dims[1..].iter().product::<u64>();
        let data: Vec<u8> = (0..n)
            .map(|b| (b as u8).wrapping_mul(31).wrapping_add(i as u8))
            .collect();
        w.add_tensor(name, ty, dims, data)
            .expect("valid sample tensor");
    }
    w
}

/// The sample file's bytes.
pub fn sample_bytes() -> Vec<u8> {
    sample_writer().to_bytes().expect("sample writes")
}

/// xorshift64*: tiny, deterministic, good enough to pick mutation sites.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform-ish in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Applies one random mutation: flip bits, overwrite with an extreme integer, truncate,
/// insert or delete bytes, or duplicate a slice.
pub fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    if bytes.is_empty() {
        bytes.push(rng.next_u64() as u8);
        return;
    }
    let at = rng.below(bytes.len());
    match rng.below(6) {
        0 => bytes[at] ^= 1 << rng.below(8),
        1 => bytes[at] = rng.next_u64() as u8,
        2 => {
            // An extreme or random little-endian integer where a count or length may sit.
            let extremes = [
                0,
                1,
                u64::MAX,
                1 << 62,
                1 << 63,
                u32::MAX as u64,
                rng.next_u64(),
            ];
            let v = extremes[rng.below(extremes.len())].to_le_bytes();
            let width = [1, 2, 4, 8][rng.below(4)];
            for (i, b) in v.iter().take(width).enumerate() {
                if let Some(slot) = bytes.get_mut(at + i) {
                    *slot = *b;
                }
            }
        }
        3 => bytes.truncate(at),
        4 => {
            let n = 1 + rng.below(16);
            let fill: Vec<u8> = (0..n).map(|_| rng.next_u64() as u8).collect();
            bytes.splice(at..at, fill);
        }
        _ => {
            let end = (at + 1 + rng.below(16)).min(bytes.len());
            bytes.drain(at..end);
        }
    }
}

/// Builds GGUF files byte by byte, for layouts the writer refuses to produce.
#[derive(Default)]
pub struct Raw(pub Vec<u8>);

impl Raw {
    /// Magic, version and the two counts.
    pub fn header(version: u32, n_tensors: u64, n_kv: u64) -> Raw {
        let mut r = Raw::default();
        r.bytes(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
        r
    }

    pub fn offset(&self) -> u64 {
        self.0.len() as u64
    }

    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }

    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }

    pub fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u64(s.len() as u64).bytes(s)
    }

    /// A metadata entry with a u32 value.
    pub fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
        self.str(key.as_bytes()).u32(4).u32(v)
    }

    /// A tensor info.
    pub fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }

    /// Zero bytes up to the next multiple of `align`.
    pub fn pad(&mut self, align: u64) -> &mut Self {
        while !self.offset().is_multiple_of(align) {
            self.0.push(0);
        }
        self
    }

    /// `n` data bytes.
    pub fn data(&mut self, n: usize) -> &mut Self {
        self.0.extend(std::iter::repeat_n(0xAB, n));
        self
    }

    pub fn build(&self) -> Vec<u8> {
        self.0.clone()
    }
}
