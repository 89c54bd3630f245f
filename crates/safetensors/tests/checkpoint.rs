//! Checkpoint directories: single file, unindexed shards, and indexed shards with each way
//! an index can be wrong (missing shard, tensor not in its shard, shard outside the dir).

mod common;

use std::path::Path;

use common::file_bytes;
use ferrite_safetensors::{Checkpoint, SafetensorsError as E};

fn shard(dir: &Path, file: &str, names: &[&str]) {
    let mut header = String::from("{");
    for (i, n) in names.iter().enumerate() {
        if i > 0 {
            header.push(',');
        }
        header += &format!(
            r#""{n}":{{"dtype":"U8","shape":[1],"data_offsets":[{i},{}]}}"#,
            i + 1
        );
    }
    header.push('}');
    let data: Vec<u8> = (0..names.len() as u8).map(|i| 10 + i).collect();
    std::fs::write(dir.join(file), file_bytes(&header, &data)).unwrap();
}

fn index(dir: &Path, map: &[(&str, &str)]) {
    let entries: Vec<String> = map.iter().map(|(t, f)| format!(r#""{t}":"{f}""#)).collect();
    let text = format!(
        r#"{{"metadata":{{}},"weight_map":{{{}}}}}"#,
        entries.join(",")
    );
    std::fs::write(dir.join("model.safetensors.index.json"), text).unwrap();
}

#[test]
fn opens_indexed_shards_in_index_order() {
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "m-1.safetensors", &["a", "b"]);
    shard(dir.path(), "m-2.safetensors", &["c"]);
    index(
        dir.path(),
        &[
            ("c", "m-2.safetensors"),
            ("a", "m-1.safetensors"),
            ("b", "m-1.safetensors"),
        ],
    );
    let ck = Checkpoint::open_dir(dir.path()).unwrap();
    assert_eq!(ck.names().collect::<Vec<_>>(), ["c", "a", "b"]);
    assert_eq!(ck.get("b").unwrap().data, &[11]);
    assert_eq!(ck.get("c").unwrap().data, &[10]);
    assert_eq!(ck.files().len(), 2);
}

#[test]
fn index_naming_a_missing_shard_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "m-1.safetensors", &["a"]);
    index(
        dir.path(),
        &[("a", "m-1.safetensors"), ("b", "m-9.safetensors")],
    );
    let err = Checkpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, E::MissingShard { shard, .. } if shard == "m-9.safetensors"),
        "{err}"
    );
}

#[test]
fn index_naming_a_tensor_its_shard_lacks_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "m-1.safetensors", &["a"]);
    index(
        dir.path(),
        &[("a", "m-1.safetensors"), ("z", "m-1.safetensors")],
    );
    let err = Checkpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, E::MissingTensor { tensor, .. } if tensor == "z"),
        "{err}"
    );
}

#[test]
fn index_shard_outside_the_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub).unwrap();
    shard(dir.path(), "outside.safetensors", &["a"]);
    index(&sub, &[("a", "../outside.safetensors")]);
    let err = Checkpoint::open_dir(&sub).unwrap_err();
    assert!(matches!(err, E::BadIndex { .. }), "{err}");
    std::fs::write(
        sub.join("model.safetensors.index.json"),
        "{\"weight_map\": 3}",
    )
    .unwrap();
    assert!(matches!(
        Checkpoint::open_dir(&sub),
        Err(E::BadIndex { .. })
    ));
}

#[test]
fn unindexed_shards_must_not_repeat_names() {
    let dir = tempfile::tempdir().unwrap();
    shard(dir.path(), "x.safetensors", &["a", "b"]);
    shard(dir.path(), "y.safetensors", &["c"]);
    assert_eq!(Checkpoint::open_dir(dir.path()).unwrap().len(), 3);
    shard(dir.path(), "z.safetensors", &["b"]);
    let err = Checkpoint::open_dir(dir.path()).unwrap_err();
    assert!(
        matches!(&err, E::DuplicateTensor { tensor, .. } if tensor == "b"),
        "{err}"
    );
}

#[test]
fn empty_directory_has_no_weights() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(
        Checkpoint::open_dir(dir.path()),
        Err(E::NoWeights { .. })
    ));
}
