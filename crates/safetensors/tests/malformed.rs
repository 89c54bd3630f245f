//! Every malformed-file rule, one test each: the oracle is the typed error variant, checked
//! against a hand-written file that breaks exactly that rule (the valid sample parses).

mod common;

use common::{file_bytes, sample};
use ferrite_safetensors::{Dtype, MAX_HEADER_LEN, SafeTensors, SafetensorsError as E};

fn open(bytes: Vec<u8>) -> Result<SafeTensors, E> {
    SafeTensors::from_bytes("t.safetensors", bytes)
}

fn one(dtype: &str, shape: &str, begin: u64, end: u64, data_len: usize) -> Vec<u8> {
    let header =
        format!(r#"{{"x":{{"dtype":"{dtype}","shape":{shape},"data_offsets":[{begin},{end}]}}}}"#);
    file_bytes(&header, &vec![0u8; data_len])
}

#[test]
fn sample_parses_with_shapes_data_and_metadata() {
    let st = open(sample()).unwrap();
    let names: Vec<&str> = st.tensors().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
    let b = st.tensor("b").unwrap();
    assert_eq!((b.dtype, b.shape.as_slice()), (Dtype::BF16, &[4u64][..]));
    assert_eq!(st.data(b), &(24..32u8).collect::<Vec<_>>()[..]);
    assert_eq!(st.tensor("c").unwrap().n_elements(), 1);
    assert_eq!(st.metadata(), &[("format".to_owned(), "pt".to_owned())]);
}

#[test]
fn rejects_file_shorter_than_length_field() {
    assert!(matches!(
        open(vec![1, 2, 3]),
        Err(E::TooShort { len: 3, .. })
    ));
}

#[test]
fn rejects_header_length_past_end_of_file() {
    let mut bytes = sample();
    let huge = bytes.len() as u64; // 8 bytes more than is left after the field
    bytes[..8].copy_from_slice(&huge.to_le_bytes());
    assert!(matches!(open(bytes), Err(E::HeaderLength { .. })));
    let mut bytes = sample();
    bytes[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(
        open(bytes),
        Err(E::HeaderLength {
            header_len: u64::MAX,
            ..
        })
    ));
}

#[test]
fn rejects_header_length_over_the_limit_even_if_file_is_large_enough() {
    // The claim is checked before the header is read: no allocation of the claimed size.
    let mut bytes = vec![0u8; 8];
    bytes[..8].copy_from_slice(&(MAX_HEADER_LEN + 1).to_le_bytes());
    assert!(matches!(open(bytes), Err(E::HeaderLength { .. })));
}

#[test]
fn rejects_non_json_and_non_object_headers() {
    assert!(matches!(
        open(file_bytes("{not json", &[])),
        Err(E::BadHeader { .. })
    ));
    assert!(matches!(
        open(file_bytes("[1,2]", &[])),
        Err(E::BadHeader { .. })
    ));
    let mut bad_utf8 = file_bytes("{}", &[]);
    bad_utf8[8] = 0xff;
    assert!(matches!(open(bad_utf8), Err(E::BadHeader { .. })));
    let no_offsets = file_bytes(r#"{"x":{"dtype":"F32","shape":[1]}}"#, &[0; 4]);
    assert!(matches!(open(no_offsets), Err(E::BadHeader { .. })));
    let negative = file_bytes(
        r#"{"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}}"#,
        &[0; 4],
    );
    assert!(matches!(open(negative), Err(E::BadHeader { .. })));
    let extra = file_bytes(
        r#"{"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"q":1}}"#,
        &[0; 4],
    );
    assert!(matches!(open(extra), Err(E::BadHeader { .. })));
    let bad_meta = file_bytes(r#"{"__metadata__":{"k":1}}"#, &[]);
    assert!(matches!(open(bad_meta), Err(E::BadHeader { .. })));
}

#[test]
fn rejects_unknown_dtype() {
    let err = open(one("Q4_0", "[2]", 0, 2, 2)).unwrap_err();
    assert!(
        matches!(&err, E::UnknownDtype { dtype, .. } if dtype == "Q4_0"),
        "{err}"
    );
}

#[test]
fn rejects_shape_dtype_size_mismatch() {
    // [2,3] F32 needs 24 bytes; the range holds 20.
    let err = open(one("F32", "[2,3]", 0, 20, 20)).unwrap_err();
    assert!(
        matches!(
            err,
            E::SizeMismatch {
                expected: 24,
                actual: 20,
                ..
            }
        ),
        "{err}"
    );
    // A size that overflows u64 is a mismatch, not a panic.
    let err = open(one("F64", "[4294967296,4294967296]", 0, 8, 8)).unwrap_err();
    assert!(
        matches!(
            err,
            E::SizeMismatch {
                expected: u64::MAX,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn rejects_ranges_outside_the_data_section() {
    let err = open(one("F32", "[2]", 0, 8, 4)).unwrap_err();
    assert!(matches!(err, E::OutOfBounds { data_len: 4, .. }), "{err}");
    let err = open(one("F32", "[2]", 8, 0, 8)).unwrap_err();
    assert!(matches!(err, E::OutOfBounds { .. }), "{err}");
    let err = open(one("U8", "[1]", u64::MAX, u64::MAX, 8)).unwrap_err();
    assert!(
        matches!(err, E::SizeMismatch { .. } | E::OutOfBounds { .. }),
        "{err}"
    );
}

#[test]
fn rejects_overlapping_tensors() {
    // Two 8-byte tensors sharing bytes 4..8: each alone is in bounds and sized right.
    let header = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    let err = open(file_bytes(header, &[0; 12])).unwrap_err();
    assert!(
        matches!(&err, E::Overlap { first, second, .. } if first == "a" && second == "b"),
        "{err}"
    );
}

#[test]
fn rejects_duplicate_names_in_one_header() {
    let header = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
    assert!(matches!(
        open(file_bytes(header, &[0; 2])),
        Err(E::DuplicateTensor { .. })
    ));
}

#[test]
fn accepts_empty_tensors_and_gaps() {
    let header = r#"{"e":{"dtype":"F32","shape":[0,3],"data_offsets":[4,4]},"x":{"dtype":"U8","shape":[2],"data_offsets":[6,8]}}"#;
    let st = open(file_bytes(header, &[0; 8])).unwrap();
    assert_eq!(st.data(st.tensor("e").unwrap()), &[] as &[u8]);
    assert_eq!(st.data(st.tensor("x").unwrap()).len(), 2);
}
