//! Robustness of the reader against malformed files. Oracle: each hand-crafted defect must
//! produce its specific `GgufError` variant (naming the key, tensor or offset), and no input
//! may panic. Every defect here was first written against a valid baseline that parses, so a
//! test cannot pass just because the baseline itself is broken.

mod common;

use common::{FIRST_KEY_OFFSET, Raw, Rng, mutate, sample_bytes, sample_writer};
use ferrite_gguf::{Array, GgmlType, Gguf, GgufError, MAX_ARRAY_DEPTH, Value};

fn parse(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
    Gguf::from_bytes(bytes)
}

fn err(bytes: Vec<u8>) -> GgufError {
    match parse(bytes) {
        Ok(g) => panic!("expected an error, parsed {g:?}"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                !msg.contains('\n') && !msg.is_empty(),
                "one-line Display: {msg:?}"
            );
            e
        }
    }
}

/// One F32 tensor `w` of 8 elements at offset 0, plus `kvs` metadata entries written by `f`.
fn one_tensor_file(n_kv: u64, f: impl FnOnce(&mut Raw)) -> Raw {
    let mut r = Raw::header(3, 1, n_kv);
    f(&mut r);
    r.tensor("w", &[8], 0, 0).pad(32).data(32);
    r
}

#[test]
fn baselines_parse() {
    let g = parse(sample_bytes()).expect("sample parses");
    assert_eq!(g.metadata().len(), 18);
    assert_eq!(g.tensors().len(), 4);
    let g = parse(
        one_tensor_file(1, |r| {
            r.kv_u32("k", 7);
        })
        .build(),
    )
    .expect("raw baseline parses");
    assert_eq!(g.get_u32("k").unwrap(), 7);
    assert_eq!(g.tensor_data(&g.tensors()[0]), &[0xAB; 32][..]);
    // Version 2 has the same layout.
    let mut v2 = one_tensor_file(0, |_| {}).build();
    v2[4] = 2;
    assert_eq!(parse(v2).unwrap().version(), 2);
}

#[test]
fn sample_round_trips_exactly() {
    let w = sample_writer();
    let g = parse(w.to_bytes().unwrap()).unwrap();
    assert_eq!(
        g.get("nested").unwrap().type_name(),
        "array of array of u16"
    );
    assert_eq!(g.get_u32("u16").unwrap(), 60000);
    assert!(matches!(
        g.get_u32("u64").unwrap_err(),
        GgufError::OutOfRange { .. }
    ));
    assert!(matches!(
        g.get_u32("i8").unwrap_err(),
        GgufError::OutOfRange { .. }
    ));
    assert_eq!(g.get_u64("u64").unwrap(), u64::MAX);
    assert_eq!(g.get_f32("f64").unwrap(), 1e-300f64 as f32);
    assert_eq!(g.get_f32("u8").unwrap(), 200.0);
    assert!(g.get_bool("bool").unwrap());
    assert_eq!(g.get_str("general.name").unwrap(), "tiny ✓");
    assert_eq!(
        g.get_str_array("tokens").unwrap(),
        ["<s>", "</s>", "hello", ""]
    );
    assert_eq!(g.get_f32_array("scores").unwrap(), [-1.5, 0.0]);
    assert_eq!(g.get_i32_array("types").unwrap(), [1, -3]);
    assert_eq!(g.get_str_array("empty").unwrap(), Vec::<&str>::new());
    for t in w.tensor_infos() {
        assert_eq!(g.tensor(&t.name), Some(&t));
    }
}

#[test]
fn getters_name_missing_keys_and_wrong_types() {
    let g = parse(sample_bytes()).unwrap();
    let e = g.get_u32("nope").unwrap_err();
    assert!(matches!(&e, GgufError::MissingKey { key } if key == "nope"));
    let e = g.get_str("u32").unwrap_err();
    assert!(
        matches!(&e, GgufError::WrongType { key, expected: "string", actual } if key == "u32" && actual == "u32"),
        "{e}"
    );
    let e = g.get_str_array("scores").unwrap_err();
    assert!(
        matches!(&e, GgufError::WrongType { expected: "array of string", actual, .. } if actual == "array of f32"),
        "{e}"
    );
    let e = g.get_i32_array("tokens").unwrap_err();
    assert!(
        matches!(&e, GgufError::WrongType { key, expected: "array of i32", .. } if key == "tokens"),
        "{e}"
    );
    let e = g.get_f32_array("tokens").unwrap_err();
    assert!(
        matches!(
            &e,
            GgufError::WrongType {
                expected: "array of f32",
                ..
            }
        ),
        "{e}"
    );
    assert!(matches!(
        g.get_bool("u8").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert!(matches!(
        g.get_f32("tokens").unwrap_err(),
        GgufError::WrongType { .. }
    ));
    assert!(matches!(
        g.get_i32_array("tokens").unwrap_err(),
        GgufError::WrongType { .. }
    ));
}

#[test]
fn every_truncation_is_a_clean_error() {
    let full = sample_bytes();
    let g = parse(full.clone()).unwrap();
    let data_offset = g.data_offset() as usize;
    let data_end = g
        .tensors()
        .iter()
        .map(|t| t.offset + t.n_bytes)
        .max()
        .unwrap() as usize
        + data_offset;
    for cut in 0..full.len() {
        let result = parse(full[..cut].to_vec());
        match (cut, result) {
            // The trailing padding after the last tensor is optional.
            (c, Ok(_)) if c >= data_end => {}
            (c, Err(GgufError::TensorOutOfBounds { .. })) if c >= data_offset && c < data_end => {}
            (c, Err(GgufError::Truncated { .. } | GgufError::CountTooLarge { .. }))
                if c < data_offset => {}
            (c, other) => panic!("cut at {c} (data at {data_offset}..{data_end}): {other:?}"),
        }
    }
}

#[test]
fn rejects_bad_magic_and_versions() {
    let good = one_tensor_file(0, |_| {}).build();
    let mut bad = good.clone();
    bad[0] = b'X';
    assert!(matches!(err(bad), GgufError::BadMagic { found } if found == b"XGUF"));
    assert!(matches!(
        err(b"GG".to_vec()),
        GgufError::Truncated { offset: 0, .. }
    ));
    assert!(matches!(
        err(b"PK\x03".to_vec()),
        GgufError::BadMagic { .. }
    ));
    assert!(matches!(err(vec![]), GgufError::Truncated { .. }));
    for version in [0, 1, 4, 0x0300_0000] {
        let mut bad = good.clone();
        bad[4..8].copy_from_slice(&u32::to_le_bytes(version));
        assert!(
            matches!(err(bad), GgufError::UnsupportedVersion { version: v } if v == version),
            "{version}"
        );
    }
}

#[test]
fn rejects_impossible_counts_before_allocating() {
    // 2^63 metadata entries or tensors in a file of a few dozen bytes.
    let e = err(Raw::header(3, 0, 1 << 63).build());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "metadata entry",
                offset: 16,
                ..
            }
        ),
        "{e}"
    );
    let e = err(Raw::header(3, 1 << 63, 0).build());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "tensor",
                offset: 8,
                ..
            }
        ),
        "{e}"
    );
    // An array of 2^63 u64s.
    let e = err(one_tensor_file(1, |r| {
        r.str(b"arr").u32(9).u32(10).u64(1 << 63);
    })
    .build());
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                what: "array item",
                ..
            }
        ),
        "{e}"
    );
    // The boundary: one more u64 than the rest of the file holds.
    let mut r = Raw::header(3, 0, 1);
    r.str(b"arr").u32(9).u32(10);
    let count_at = r.offset();
    r.u64(4).data(32);
    assert!(parse(r.build()).is_ok(), "exactly 4 u64s fit");
    let mut bytes = r.build();
    bytes[count_at as usize] = 5;
    let e = err(bytes);
    assert!(
        matches!(
            e,
            GgufError::CountTooLarge {
                count: 5,
                max: 4,
                remaining: 32,
                ..
            }
        ),
        "{e}"
    );
    // Nested arrays: 2^62 inner arrays.
    let e = err(one_tensor_file(1, |r| {
        r.str(b"arr").u32(9).u32(9).u64(1 << 62);
    })
    .build());
    assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
}

#[test]
fn rejects_huge_string_lengths() {
    let e = err(one_tensor_file(1, |r| {
        r.u64(1 << 62);
    })
    .build());
    assert!(
        matches!(e, GgufError::Truncated { offset, needed, what: "metadata key", .. }
            if offset == FIRST_KEY_OFFSET + 8 && needed == 1 << 62),
        "{e}"
    );
    let e = err(one_tensor_file(1, |r| {
        r.str(b"s").u32(8).u64(u64::MAX);
    })
    .build());
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                what: "string value",
                ..
            }
        ),
        "{e}"
    );
    let mut r = Raw::header(3, 1, 0);
    r.u64(1 << 62).data(64);
    assert!(matches!(
        err(r.build()),
        GgufError::Truncated {
            what: "tensor name",
            ..
        }
    ));
}

#[test]
fn rejects_bad_value_types_and_bools() {
    let e = err(one_tensor_file(1, |r| {
        r.str(b"k").u32(13).u32(0);
    })
    .build());
    assert!(
        matches!(&e, GgufError::UnknownValueType { key, type_id: 13, offset } if key == "k" && *offset == FIRST_KEY_OFFSET + 9),
        "{e}"
    );
    let e = err(one_tensor_file(1, |r| {
        r.str(b"k").u32(9).u32(99).u64(0);
    })
    .build());
    assert!(
        matches!(e, GgufError::UnknownValueType { type_id: 99, .. }),
        "{e}"
    );
    let e = err(one_tensor_file(1, |r| {
        r.str(b"b").u32(7).bytes(&[2]);
    })
    .build());
    assert!(
        matches!(&e, GgufError::InvalidBool { key, byte: 2, .. } if key == "b"),
        "{e}"
    );
}

#[test]
fn rejects_bad_utf8() {
    let e = err(one_tensor_file(1, |r| {
        r.str(b"k\xff").u32(4).u32(0);
    })
    .build());
    assert!(
        matches!(
            e,
            GgufError::InvalidUtf8 {
                offset: FIRST_KEY_OFFSET
            }
        ),
        "{e}"
    );
    let e = err(one_tensor_file(1, |r| {
        r.str(b"k").u32(8).str(b"\xc3\x28");
    })
    .build());
    assert!(
        matches!(e, GgufError::InvalidUtf8 { offset } if offset == FIRST_KEY_OFFSET + 13),
        "{e}"
    );
    let mut r = Raw::header(3, 1, 0);
    r.str(b"\x80").u32(1).u64(8).u32(0).u64(0).pad(32).data(32);
    assert!(matches!(err(r.build()), GgufError::InvalidUtf8 { .. }));
}

#[test]
fn rejects_duplicate_keys_and_tensor_names() {
    let mut second_at = 0;
    let e = err(one_tensor_file(2, |r| {
        r.kv_u32("k", 1);
        second_at = r.offset();
        r.kv_u32("k", 2);
    })
    .build());
    assert!(
        matches!(&e, GgufError::DuplicateKey { key, offset } if key == "k" && *offset == second_at),
        "{e}"
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("w", &[8], 0, 0)
        .tensor("w", &[8], 0, 32)
        .pad(32)
        .data(64);
    assert!(matches!(err(r.build()), GgufError::DuplicateTensor { tensor, .. } if tensor == "w"));
}

#[test]
fn caps_array_nesting() {
    let nested = |levels: usize| {
        let mut r = Raw::header(3, 0, 1);
        r.str(b"deep").u32(9);
        for _ in 1..levels {
            r.u32(9).u64(1);
        }
        r.u32(0).u64(0);
        r.build()
    };
    let g = parse(nested(MAX_ARRAY_DEPTH)).expect("the deepest allowed nesting parses");
    let mut v = g.get("deep").unwrap().as_array().unwrap();
    for _ in 1..MAX_ARRAY_DEPTH {
        let Array::Array(items) = v else {
            panic!("level is not an array of arrays: {v:?}")
        };
        v = &items[0];
    }
    assert_eq!(v, &Array::U8(vec![]));
    let e = err(nested(MAX_ARRAY_DEPTH + 1));
    assert!(
        matches!(&e, GgufError::NestingTooDeep { key, .. } if key == "deep"),
        "{e}"
    );
    // Deep enough to overflow the stack without the cap, in under a megabyte.
    assert!(matches!(
        err(nested(50_000)),
        GgufError::NestingTooDeep { .. }
    ));
}

#[test]
fn rejects_bad_alignment() {
    for (value, bad) in [
        (Value::U32(0), "0"),
        (Value::U32(48), "48"),
        (Value::I32(-32), "-32"),
    ] {
        let mut w = ferrite_gguf::GgufWriter::new();
        w.add_metadata("x", Value::U8(0)).unwrap();
        let mut bytes = w.to_bytes().unwrap();
        // Rewrite the entry in place as general.alignment with the bad value.
        bytes.truncate(FIRST_KEY_OFFSET as usize);
        let mut r = Raw(bytes);
        r.str(b"general.alignment").u32(value.type_id());
        match value {
            Value::U32(v) => r.u32(v),
            Value::I32(v) => r.bytes(&v.to_le_bytes()),
            _ => unreachable!(),
        };
        let e = err(r.build());
        assert!(
            matches!(&e, GgufError::BadAlignment { value } if value == bad),
            "{e}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.str(b"general.alignment").u32(8).str(b"32");
    assert!(matches!(err(r.build()), GgufError::WrongType { .. }));
}

#[test]
fn honours_alignment_for_offsets() {
    let mut r = Raw::header(3, 2, 1);
    r.kv_u32("general.alignment", 64);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 32)
        .pad(64)
        .data(128);
    let e = err(r.build());
    assert!(
        matches!(&e, GgufError::UnalignedTensor { tensor, offset: 32, alignment: 64 } if tensor == "b"),
        "{e}"
    );
    // The tensor table ends at byte 90; the file stops at 104, short of the 64-aligned
    // data section at 128.
    let mut r = Raw::header(3, 1, 1);
    r.kv_u32("general.alignment", 64);
    r.tensor("a", &[8], 0, 0);
    assert_eq!(r.offset(), 90);
    let e = err(r.pad(32).data(8).build());
    assert!(
        matches!(
            e,
            GgufError::Truncated {
                what: "padding before tensor data",
                offset: 90,
                needed: 38,
                available: 14
            }
        ),
        "{e}"
    );
}

#[test]
fn rejects_bad_tensor_types_and_shapes() {
    let tensor_err = |dims: &[u64], ty: u32| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", dims, ty, 0).pad(32).data(64);
        err(r.build())
    };
    // Type 4 was Q4_2, removed from ggml.
    let e = tensor_err(&[8], 4);
    assert!(
        matches!(&e, GgufError::UnknownTensorType { tensor, type_id: 4, .. } if tensor == "t"),
        "{e}"
    );
    assert!(matches!(
        tensor_err(&[8], 1000),
        GgufError::UnknownTensorType { .. }
    ));
    assert!(matches!(tensor_err(&[], 0), GgufError::BadDims { .. }));
    assert!(matches!(
        tensor_err(&[1, 1, 1, 1, 1], 0),
        GgufError::TooManyDims { n_dims: 5, .. }
    ));
    assert!(matches!(tensor_err(&[8, 0], 0), GgufError::BadDims { .. }));
    assert!(matches!(
        tensor_err(&[1 << 32, 1 << 32], 0),
        GgufError::SizeOverflow { .. }
    ));
    assert!(matches!(
        tensor_err(&[1 << 62, 2], 0),
        GgufError::SizeOverflow { .. }
    ));
    let e = tensor_err(&[100, 2], GgmlType::Q4_K.id());
    assert!(
        matches!(
            e,
            GgufError::PartialBlock {
                row: 100,
                block: 256,
                ty: GgmlType::Q4_K,
                ..
            }
        ),
        "{e}"
    );
    // A dimension count of u32::MAX must fail before reading (or allocating) dimensions.
    let mut r = Raw::header(3, 1, 0);
    r.str(b"t").u32(u32::MAX).data(64);
    assert!(matches!(
        err(r.build()),
        GgufError::TooManyDims {
            n_dims: u32::MAX,
            ..
        }
    ));
}

#[test]
fn rejects_tensor_data_outside_the_file() {
    let layout_err = |offset: u64| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor("t", &[8], 0, offset).pad(32).data(64);
        err(r.build())
    };
    let e = layout_err(64);
    assert!(
        matches!(&e, GgufError::TensorOutOfBounds { tensor, offset: 64, n_bytes: 32, data_size: 64 } if tensor == "t"),
        "{e}"
    );
    assert!(matches!(
        layout_err(u64::MAX - 31),
        GgufError::TensorOutOfBounds { .. }
    ));
    assert!(matches!(
        layout_err(4),
        GgufError::UnalignedTensor { offset: 4, .. }
    ));
}

/// Planted defect: two tensors whose ranges overlap by one element. A checker that only
/// looked at bounds and alignment would accept this file.
#[test]
fn rejects_overlapping_tensors() {
    let mut r = Raw::header(3, 3, 0);
    r.tensor("big", &[9], 0, 0)
        .tensor("c", &[8], 0, 64)
        .tensor("small", &[8], 0, 32);
    r.pad(32).data(96);
    let e = err(r.build());
    assert!(
        matches!(&e, GgufError::OverlappingTensors { first, second, offset: 32 } if first == "big" && second == "small"),
        "{e}"
    );
    // Same layout with `big` one element shorter parses.
    let mut r = Raw::header(3, 3, 0);
    r.tensor("big", &[8], 0, 0)
        .tensor("c", &[8], 0, 64)
        .tensor("small", &[8], 0, 32);
    r.pad(32).data(96);
    assert!(parse(r.build()).is_ok());
    // Two tensors at the same offset.
    let mut r = Raw::header(3, 2, 0);
    r.tensor("a", &[8], 0, 0)
        .tensor("b", &[8], 0, 0)
        .pad(32)
        .data(32);
    assert!(matches!(
        err(r.build()),
        GgufError::OverlappingTensors { .. }
    ));
}

#[test]
fn random_mutations_never_panic() {
    const MUTANTS: usize = 3000;
    let base = sample_bytes();
    let mut rng = Rng::new(0x5EED_2026);
    let (mut ok, mut errs) = (0usize, 0usize);
    for i in 0..MUTANTS {
        let mut bytes = base.clone();
        for _ in 0..1 + rng.below(4) {
            mutate(&mut rng, &mut bytes);
        }
        let result = std::panic::catch_unwind(|| match Gguf::from_bytes(bytes) {
            Ok(g) => {
                // Exercise the accessors on whatever parsed.
                for t in g.tensors() {
                    assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
                }
                for (k, _) in g.metadata() {
                    let _ = (
                        g.get_u32(k),
                        g.get_f32(k),
                        g.get_str_array(k),
                        g.get_i32_array(k),
                    );
                }
                true
            }
            Err(e) => {
                assert!(!e.to_string().contains('\n'));
                false
            }
        });
        match result {
            Ok(true) => ok += 1,
            Ok(false) => errs += 1,
            Err(_) => panic!("mutant {i} panicked"),
        }
    }
    println!("{MUTANTS} mutants: {ok} parsed, {errs} rejected cleanly");
    assert!(
        errs > MUTANTS / 2,
        "most mutants should be rejected: {errs}"
    );
    assert!(
        ok > 0,
        "some mutants (e.g. in tensor data) should still parse"
    );
}
