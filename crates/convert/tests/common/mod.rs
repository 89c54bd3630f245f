//! Shared by the integration tests: a safetensors writer and deterministic tensor values.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::path::Path;

/// Deterministic distinct values for a tensor: value i of tensor `seed`.
pub fn values(seed: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| seed as f32 * 1000.0 + i as f32 * 0.25)
        .collect()
}

/// One tensor to write: name, safetensors dtype, shape and raw bytes.
pub struct Tensor {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub fn f32_tensor(name: &str, shape: &[usize], seed: usize) -> Tensor {
    let n = shape.iter().product();
    Tensor {
        name: name.into(),
        dtype: "F32",
        shape: shape.to_vec(),
        bytes: values(seed, n)
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect(),
    }
}

pub fn bf16_tensor(name: &str, shape: &[usize], seed: usize) -> Tensor {
    let n = shape.iter().product();
    Tensor {
        name: name.into(),
        dtype: "BF16",
        shape: shape.to_vec(),
        bytes: values(seed, n)
            .iter()
            .flat_map(|x| ((x.to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
    }
}

pub fn write_safetensors(path: &Path, tensors: &[Tensor]) {
    let mut header = String::from("{");
    let mut offset = 0;
    for (i, t) in tensors.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header += &format!(
            r#""{}":{{"dtype":"{}","shape":{:?},"data_offsets":[{},{}]}}"#,
            t.name,
            t.dtype,
            t.shape,
            offset,
            offset + t.bytes.len()
        );
        offset += t.bytes.len();
    }
    header.push('}');
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header.as_bytes());
    for t in tensors {
        out.extend_from_slice(&t.bytes);
    }
    std::fs::write(path, out).unwrap();
}
