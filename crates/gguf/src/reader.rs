//! [`Gguf`]: an opened, fully validated GGUF file and typed access to its metadata and
//! tensor data.
//!
//! The file is either memory-mapped ([`Gguf::open`]) or held in a `Vec` ([`Gguf::from_bytes`],
//! for tests and fuzzing). Validation happens once, when the file is opened, so every
//! accessor afterwards is infallible except for asking for a missing key or the wrong type.

use std::collections::HashMap;
use std::path::Path;

use crate::parse::{Parsed, parse};
use crate::{Array, GgufError, Strings, TensorInfo, Value};

/// Where the file's bytes live.
enum Storage {
    Mmap(memmap2::Mmap),
    Bytes(Vec<u8>),
}

/// A validated GGUF file: header, metadata (in file order), tensor table and the bytes.
pub struct Gguf {
    storage: Storage,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for Gguf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gguf")
            .field("version", &self.version)
            .field("file_size", &self.file_size())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .finish_non_exhaustive()
    }
}

impl Gguf {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: &Path) -> Result<Gguf, GgufError> {
        let io = |source| GgufError::Io {
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        // SAFETY: the map is read-only and lives as long as `Gguf`. Undefined behaviour is
        // only possible if another process truncates or rewrites the file while it is
        // mapped; model files are treated as immutable while open, like every mmap-based
        // loader does, and that cannot be prevented from inside this process.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Self::with_storage(Storage::Mmap(map))
    }

    /// Validates a file held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Gguf, GgufError> {
        Self::with_storage(Storage::Bytes(bytes))
    }

    fn with_storage(storage: Storage) -> Result<Gguf, GgufError> {
        let buf: &[u8] = match &storage {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        };
        let Parsed {
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        } = parse(buf)?;
        Ok(Gguf {
            storage,
            version,
            alignment,
            data_offset,
            metadata,
            key_index,
            tensors,
            tensor_index,
        })
    }

    /// GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of tensor data: `general.alignment`, or 32 when absent.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute file offset of the tensor data section. For a file without tensors whose
    /// trailing padding is absent this is the file size.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Size of the whole file in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes().len() as u64
    }

    /// The whole file.
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Mmap(m) => m,
            Storage::Bytes(b) => b,
        }
    }

    /// All metadata entries, in file order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.metadata
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_owned(),
        })
    }

    fn integer<T: TryFrom<i128>>(&self, key: &str, expected: &'static str) -> Result<T, GgufError> {
        let value = self.require(key)?;
        let int = value
            .as_integer()
            .ok_or_else(|| wrong_type(key, expected, value))?;
        T::try_from(int).map_err(|_| GgufError::OutOfRange {
            key: key.to_owned(),
            expected,
            value: int.to_string(),
        })
    }

    /// `key` as `u32`: any integer type whose value fits losslessly.
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.integer(key, "u32")
    }

    /// `key` as `u64`: any integer type whose value fits losslessly.
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.integer(key, "u64")
    }

    /// `key` as `f32`: f32, f64 (rounded to nearest) or any integer type.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        let value = self.require(key)?;
        value.as_f32().ok_or_else(|| wrong_type(key, "f32", value))
    }

    /// `key` as `bool`.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            other => Err(wrong_type(key, "bool", other)),
        }
    }

    /// `key` as a string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let value = self.require(key)?;
        value
            .as_str()
            .ok_or_else(|| wrong_type(key, "string", value))
    }

    fn array(&self, key: &str, expected: &'static str) -> Result<&Array, GgufError> {
        let value = self.require(key)?;
        value
            .as_array()
            .ok_or_else(|| wrong_type(key, expected, value))
    }

    /// `key` as an array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        Ok(self.get_strings(key)?.iter().collect())
    }

    /// `key` as an array of strings, as stored (no per-item allocation).
    pub fn get_strings(&self, key: &str) -> Result<&Strings, GgufError> {
        const EXPECTED: &str = "array of string";
        let array = self.array(key, EXPECTED)?;
        array
            .as_strings()
            .ok_or_else(|| wrong_items(key, EXPECTED, array))
    }

    /// `key` as an array of `f32`: items may be f32, f64 or integers, as for
    /// [`Gguf::get_f32`].
    pub fn get_f32_array(&self, key: &str) -> Result<Vec<f32>, GgufError> {
        const EXPECTED: &str = "array of f32";
        let array = self.array(key, EXPECTED)?;
        array
            .floats()
            .ok_or_else(|| wrong_items(key, EXPECTED, array))
    }

    /// `key` as an array of `i32`: items may be any integer type whose values fit.
    pub fn get_i32_array(&self, key: &str) -> Result<Vec<i32>, GgufError> {
        const EXPECTED: &str = "array of i32";
        let array = self.array(key, EXPECTED)?;
        let ints = array
            .integers()
            .ok_or_else(|| wrong_items(key, EXPECTED, array))?;
        ints.into_iter()
            .map(|int| {
                i32::try_from(int).map_err(|_| GgufError::OutOfRange {
                    key: key.to_owned(),
                    expected: "i32",
                    value: int.to_string(),
                })
            })
            .collect()
    }

    /// The tensor table, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor named `name`, if present.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of tensor `t`: exactly `t.n_bytes` bytes for a `TensorInfo` taken from this
    /// file (validation guaranteed they exist). A `TensorInfo` from elsewhere that does not
    /// fit this file yields an empty slice rather than a panic.
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let range = || {
            let start = usize::try_from(self.data_offset.checked_add(t.offset)?).ok()?;
            let len = usize::try_from(t.n_bytes).ok()?;
            Some(start..start.checked_add(len)?)
        };
        range().and_then(|r| self.bytes().get(r)).unwrap_or(&[])
    }

    /// Drops the pages inside `data`, a part of this file's bytes (a tensor's, say), from
    /// this process's resident set, for a caller that keeps its own copy of them (rows
    /// repacked for a kernel), so that the process does not hold them twice. The bytes stay
    /// readable and unchanged: a later read maps their pages back from the file. Only the
    /// whole pages inside `data` are dropped; a slice from elsewhere, a file held in memory
    /// and pages the OS declines to drop are left as they are, since this only saves memory.
    pub fn release_pages(&self, data: &[u8]) {
        #[cfg(unix)]
        if let Storage::Mmap(map) = &self.storage {
            // SAFETY: sysconf has no preconditions; it reads a constant of the system.
            let Ok(page) = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }) else {
                return;
            };
            let base = map.as_ptr() as usize;
            let Some(start) = (data.as_ptr() as usize).checked_sub(base) else {
                return;
            };
            let end = start + data.len();
            if end > map.len() || page == 0 {
                return;
            }
            let (lo, hi) = (start.next_multiple_of(page), end / page * page);
            if lo < hi {
                // SAFETY: the map is read-only (PROT_READ, shared with the file), so no page of
                // it was ever written: dropping pages discards nothing, and a later read
                // faults in the file's bytes, the same ones every borrow of the map already
                // saw (the file is not rewritten while open, as `open` assumes). The span
                // lies inside the map (checked above) and is page aligned (the map starts on
                // a page).
                let _ = unsafe {
                    map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
                };
            }
        }
    }
}

fn wrong_items(key: &str, expected: &'static str, actual: &Array) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        actual: actual.type_name(),
    }
}

fn wrong_type(key: &str, expected: &'static str, actual: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_owned(),
        expected,
        actual: actual.type_name(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GgmlType, GgufWriter};

    fn sample() -> GgufWriter<'static> {
        let mut w = GgufWriter::new();
        w.add_metadata("general.architecture", Value::String("test".into()))
            .unwrap()
            .add_metadata(
                "tokens",
                Value::Array(Array::String(["a"].into_iter().collect())),
            )
            .unwrap();
        w.add_tensor("t", GgmlType::F32, &[4], vec![7u8; 16])
            .unwrap();
        w
    }

    #[test]
    fn open_maps_the_same_file_from_bytes_reads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        let w = sample();
        let written = w.write_file(&path).unwrap();
        let mapped = Gguf::open(&path).unwrap();
        let owned = Gguf::from_bytes(w.to_bytes().unwrap()).unwrap();
        assert_eq!(mapped.file_size(), written);
        assert_eq!(mapped.bytes(), owned.bytes());
        assert_eq!(mapped.metadata(), owned.metadata());
        assert_eq!(mapped.tensors(), owned.tensors());
        let t = mapped.tensor("t").unwrap();
        assert_eq!(mapped.tensor_data(t), &[7u8; 16][..]);
    }

    #[test]
    fn open_reports_io_errors_and_empty_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.gguf");
        let e = Gguf::open(&missing).unwrap_err();
        assert!(
            matches!(&e, GgufError::Io { path, .. } if path.ends_with("missing.gguf")),
            "{e}"
        );
        let empty = dir.path().join("empty.gguf");
        std::fs::write(&empty, b"").unwrap();
        assert!(Gguf::open(&empty).is_err());
    }

    #[test]
    fn tensor_data_of_a_foreign_info_is_empty_not_a_panic() {
        let g = Gguf::from_bytes(sample().to_bytes().unwrap()).unwrap();
        let mut t = g.tensor("t").unwrap().clone();
        t.offset = u64::MAX;
        assert!(g.tensor_data(&t).is_empty());
        t.offset = 0;
        t.n_bytes = 1 << 40;
        assert!(g.tensor_data(&t).is_empty());
    }

    #[test]
    fn files_without_tensors_need_no_trailing_padding() {
        let mut w = GgufWriter::new();
        w.add_metadata("k", Value::U8(1)).unwrap();
        let mut bytes = w.to_bytes().unwrap();
        let unpadded = 24 + 8 + 1 + 4 + 1;
        assert!(bytes[unpadded..].iter().all(|&b| b == 0));
        bytes.truncate(unpadded);
        let g = Gguf::from_bytes(bytes).unwrap();
        assert_eq!(g.data_offset(), g.file_size());
        assert!(g.tensors().is_empty());
    }

    /// Resident KiB of the mapping of `path` in this process (Linux `smaps`).
    #[cfg(target_os = "linux")]
    fn resident_kib(path: &Path) -> usize {
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let name = path.to_str().unwrap();
        let mut lines = smaps.lines().skip_while(|l| !l.ends_with(name));
        lines.next().expect("the file is mapped");
        let rss = lines.find(|l| l.starts_with("Rss:")).expect("an Rss line");
        rss.split_whitespace().nth(1).unwrap().parse().unwrap()
    }

    /// Oracle: the kernel's own count of the mapping's resident pages, and the bytes, which
    /// must read the same after their pages are dropped.
    #[cfg(target_os = "linux")]
    #[test]
    fn released_tensor_pages_leave_the_resident_set_and_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.gguf");
        let n = 256 * 1024;
        let data: Vec<u8> = (0..n * 4).map(|i| (i * 7 % 251) as u8).collect();
        let mut w = GgufWriter::new();
        w.add_tensor("big", GgmlType::F32, &[n as u64], data.as_slice())
            .unwrap();
        w.write_file(&path).unwrap();
        let g = Gguf::open(&path).unwrap();
        let t = g.tensor("big").unwrap();
        assert_eq!(g.tensor_data(t), data.as_slice());
        let before = resident_kib(&path);
        assert!(before >= 1024, "a read MiB is resident: {before} KiB");
        g.release_pages(g.tensor_data(t));
        let after = resident_kib(&path);
        // All but the partial pages at either end leave.
        assert!(after <= 8, "{before} KiB -> {after} KiB");
        assert_eq!(
            g.tensor_data(t),
            data.as_slice(),
            "the bytes read back unchanged"
        );
        g.release_pages(g.tensor_data(t));
        let elsewhere = data.clone();
        g.release_pages(&elsewhere);
        g.release_pages(&[]);
        let owned = Gguf::from_bytes(std::fs::read(&path).unwrap()).unwrap();
        owned.release_pages(owned.tensor_data(owned.tensor("big").unwrap()));
        assert_eq!(
            owned.tensor_data(owned.tensor("big").unwrap()),
            data.as_slice()
        );
    }
}
