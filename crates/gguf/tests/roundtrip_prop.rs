//! Property: reading what the writer wrote gives back exactly the metadata (same order,
//! same variants, float bits included, NaN too) and the tensors (name, type, shape, bytes).
//! Oracle: the writer's input itself.

use std::collections::BTreeMap;

use ferrite_gguf::{ALL_TYPES, Array, GgmlType, Gguf, GgufWriter, Value};
use proptest::prelude::*;

/// Bitwise equality, so NaN payloads and -0.0 count.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::F32(x), Value::F32(y)) => x.to_bits() == y.to_bits(),
        (Value::F64(x), Value::F64(y)) => x.to_bits() == y.to_bits(),
        (Value::Array(x), Value::Array(y)) => {
            x.elem_type_id() == y.elem_type_id()
                && x.len() == y.len()
                && (0..x.len()).all(|i| match (x.get(i), y.get(i)) {
                    (Some(a), Some(b)) => same(&a, &b),
                    _ => false,
                })
        }
        _ => a == b,
    }
}

/// A scalar of GGUF value type `ty` (any id except 9, array).
fn scalar(ty: u32) -> BoxedStrategy<Value> {
    match ty {
        0 => any::<u8>().prop_map(Value::U8).boxed(),
        1 => any::<i8>().prop_map(Value::I8).boxed(),
        2 => any::<u16>().prop_map(Value::U16).boxed(),
        3 => any::<i16>().prop_map(Value::I16).boxed(),
        4 => any::<u32>().prop_map(Value::U32).boxed(),
        5 => any::<i32>().prop_map(Value::I32).boxed(),
        6 => any::<u32>()
            .prop_map(|b| Value::F32(f32::from_bits(b)))
            .boxed(),
        7 => any::<bool>().prop_map(Value::Bool).boxed(),
        8 => any::<String>().prop_map(Value::String).boxed(),
        10 => any::<u64>().prop_map(Value::U64).boxed(),
        11 => any::<i64>().prop_map(Value::I64).boxed(),
        _ => any::<u64>()
            .prop_map(|b| Value::F64(f64::from_bits(b)))
            .boxed(),
    }
}

const SCALAR_TYPES: [u32; 12] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12];

/// An array of items of one scalar type, chosen at random.
fn flat_array() -> BoxedStrategy<Array> {
    fn of<T: Arbitrary + 'static>(wrap: fn(Vec<T>) -> Array) -> BoxedStrategy<Array> {
        prop::collection::vec(any::<T>(), 0..6)
            .prop_map(wrap)
            .boxed()
    }
    let f32s = prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..6);
    let f64s = prop::collection::vec(any::<u64>().prop_map(f64::from_bits), 0..6);
    prop_oneof![
        of(Array::U8),
        of(Array::I8),
        of(Array::U16),
        of(Array::I16),
        of(Array::U32),
        of(Array::I32),
        f32s.prop_map(Array::F32),
        of(Array::Bool),
        prop::collection::vec(any::<String>(), 0..6)
            .prop_map(|v| Array::String(v.into_iter().collect())),
        of(Array::U64),
        of(Array::I64),
        f64s.prop_map(Array::F64),
    ]
    .boxed()
}

/// An array, possibly of arrays (each inner array with its own item type).
fn array(depth: u32) -> BoxedStrategy<Array> {
    if depth == 0 {
        return flat_array();
    }
    prop_oneof![
        3 => flat_array(),
        1 => prop::collection::vec(array(depth - 1), 0..4).prop_map(Array::Array),
    ]
    .boxed()
}

fn value() -> BoxedStrategy<Value> {
    prop_oneof![
        3 => prop::sample::select(&SCALAR_TYPES[..]).prop_flat_map(scalar),
        1 => array(2).prop_map(Value::Array),
    ]
    .boxed()
}

/// A tensor: type, shape with whole-block rows, and random bytes of the right length.
fn tensor() -> impl Strategy<Value = (GgmlType, Vec<u64>, Vec<u8>)> {
    (
        prop::sample::select(&ALL_TYPES[..]),
        1u64..3,
        prop::collection::vec(1u64..4, 0..4),
    )
        .prop_flat_map(|(ty, blocks, rest)| {
            let mut dims = vec![blocks * ty.block_size()];
            dims.extend(rest);
            let n = ty.row_bytes(dims[0]).unwrap_or(0) * dims[1..].iter().product::<u64>();
            (
                Just(ty),
                Just(dims),
                prop::collection::vec(any::<u8>(), n as usize),
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn read_of_write_is_identity(
        metadata in prop::collection::btree_map("[a-z_]{1,8}(\\.[a-z_]{1,8}){0,2}", value(), 0..10),
        tensors in prop::collection::vec(tensor(), 0..5),
        align_exp in prop::option::of(0u32..9),
    ) {
        let mut w = GgufWriter::new();
        let mut expected: Vec<(String, Value)> = Vec::new();
        if let Some(e) = align_exp {
            w.add_metadata("general.alignment", Value::U32(1 << e)).unwrap();
            expected.push(("general.alignment".into(), Value::U32(1 << e)));
        }
        let metadata: BTreeMap<String, Value> = metadata;
        for (k, v) in metadata {
            w.add_metadata(k.clone(), v.clone()).unwrap();
            expected.push((k, v));
        }
        for (i, (ty, dims, data)) in tensors.iter().enumerate() {
            w.add_tensor(format!("blk.{i}.weight"), *ty, dims, data.as_slice()).unwrap();
        }
        let g = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();

        prop_assert_eq!(g.version(), 3);
        prop_assert_eq!(g.alignment(), align_exp.map_or(32, |e| 1u64 << e));
        prop_assert_eq!(g.metadata().len(), expected.len());
        for ((k, v), (k2, v2)) in g.metadata().iter().zip(&expected) {
            prop_assert_eq!(k, k2);
            prop_assert!(same(v, v2), "{}: {:?} != {:?}", k, v, v2);
        }
        prop_assert_eq!(g.tensors().len(), tensors.len());
        for (i, (ty, dims, data)) in tensors.iter().enumerate() {
            let t = g.tensor(&format!("blk.{i}.weight")).unwrap();
            prop_assert_eq!(t.ty, *ty);
            prop_assert_eq!(&t.dims, dims);
            prop_assert_eq!(t.offset % g.alignment(), 0);
            prop_assert_eq!(g.tensor_data(t), data.as_slice());
        }
    }
}
