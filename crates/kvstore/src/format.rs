//! The snapshot file format (version 3), byte by byte in docs/kv-snapshot-format.md:
//! a fixed 240-byte header sealed by its own SHA-256, then the payload (token ids, KV rows,
//! a hybrid's recurrent state, optional logits, optional application metadata) sealed by
//! the SHA-256 in the header.
//!
//! Reading never trusts a length: every section size is recomputed from the shape fields
//! with checked arithmetic and the total must equal the file size before anything is
//! allocated, so a damaged or hostile file costs at most its own size in memory.

use std::io::{Read, Write};

use ferrite_model::{KvType, SessionState};
use sha2::{Digest, Sha256};

use crate::KvStoreError;

/// The first eight bytes of every snapshot file.
pub const MAGIC: [u8; 8] = *b"FRKVSNAP";
/// The format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 3;
/// Size of the fixed header in bytes.
pub const HEADER_LEN: usize = 240;
/// Header bytes the header's own SHA-256 covers (the digest fills the rest).
pub const HEADER_SEALED: usize = HEADER_LEN - 32;
/// The ferrite version recorded in (and required of) snapshots.
pub const FERRITE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The compute backend whose kernels produced a snapshot's KV rows and logits. The CPU
/// and CUDA backends round differently (f32 accumulation order, f16 GEMM inputs in CUDA
/// prefill), so their rows for the same tokens differ in low bits; a snapshot is only
/// restored on the backend that wrote it (see docs/kv-snapshot-format.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SnapshotBackend {
    /// The CPU backend (`ferrite-model`).
    #[default]
    Cpu,
    /// The CUDA backend (`ferrite-cuda`).
    Cuda,
}

impl SnapshotBackend {
    /// The header byte of this backend.
    pub fn code(self) -> u8 {
        match self {
            SnapshotBackend::Cpu => 0,
            SnapshotBackend::Cuda => 1,
        }
    }

    /// The backend of a header byte, if known.
    pub fn from_code(code: u8) -> Option<SnapshotBackend> {
        match code {
            0 => Some(SnapshotBackend::Cpu),
            1 => Some(SnapshotBackend::Cuda),
            _ => None,
        }
    }

    /// The backend's name as the CLI spells it.
    pub fn name(self) -> &'static str {
        match self {
            SnapshotBackend::Cpu => "cpu",
            SnapshotBackend::Cuda => "cuda",
        }
    }
}

/// Everything a snapshot must agree on with the session that restores it. Two sessions
/// with equal `Compat` compute bit-identical KV rows for the same tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compat {
    /// SHA-256 of the model file (covers weights, quantization and tokenizer).
    pub model_sha256: [u8; 32],
    /// `general.architecture` (at most 16 bytes are stored).
    pub arch: String,
    /// Weight precision tag: 0 = weights used as stored, 1 = dequantized to f32 at load.
    pub precision: u8,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Context size of the session.
    pub ctx: u64,
    /// Number of layers.
    pub n_layer: u32,
    /// Stored elements per key or value row ([`KvType::row_elems`]).
    pub kv_row: u32,
    /// Vocabulary size (length of the logits).
    pub n_vocab: u32,
    /// The backend that computes the session's KV rows.
    pub backend: SnapshotBackend,
    /// Layers with a recurrent state, and f32 values of each (0, 0 for attention only).
    pub state: (u32, u32),
}

impl Compat {
    /// The compat block of CPU sessions of `model` (whose file has digest `model_sha256`,
    /// see [`crate::model_sha256`]) with a KV cache of type `kv_type` and `ctx` positions;
    /// set [`Compat::backend`] for another backend.
    pub fn for_session(
        model: &ferrite_model::Model,
        model_sha256: [u8; 32],
        kv_type: KvType,
        ctx: usize,
    ) -> Compat {
        let c = model.config();
        Compat {
            model_sha256,
            arch: c.arch.name().into(),
            precision: match model.precision() {
                ferrite_model::Precision::Default => 0,
                ferrite_model::Precision::F32 => 1,
            },
            kv_type,
            ctx: ctx as u64,
            n_layer: c.kv_layers() as u32,
            kv_row: kv_type
                .row_elems(c.n_kv_head, c.head_dim)
                .and_then(|r| u32::try_from(r).ok())
                .unwrap_or(u32::MAX),
            n_vocab: c.n_vocab as u32,
            backend: SnapshotBackend::Cpu,
            state: {
                let (slots, len) = c.state_slots();
                (slots as u32, len as u32)
            },
        }
    }
}

/// A decoded snapshot: the session state and the application's metadata bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// Token ids, KV rows and logits.
    pub state: SessionState,
    /// Opaque bytes the writer attached (the CLI stores its chat messages here).
    pub meta: Vec<u8>,
}

/// The parsed, validated header of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Compatibility fields.
    pub compat: Compat,
    /// ferrite version that wrote the file.
    pub ferrite_version: String,
    /// Positions held.
    pub n_tokens: u64,
    /// Bytes of the token section (`4 × n_tokens`).
    pub tokens_bytes: u64,
    /// Bytes of the KV section.
    pub kv_bytes: u64,
    /// Bytes of the recurrent-state section (`4 × slots × len`).
    pub state_bytes: u64,
    /// Bytes of the logits section (0 or `4 × n_vocab`).
    pub logits_bytes: u64,
    /// Bytes of the metadata section.
    pub meta_bytes: u64,
    /// SHA-256 of the whole payload.
    pub payload_sha256: [u8; 32],
}

impl Header {
    /// Total payload bytes (validated not to overflow when parsed).
    pub fn payload_len(&self) -> u64 {
        self.tokens_bytes + self.kv_bytes + self.state_bytes + self.logits_bytes + self.meta_bytes
    }
}

/// The header byte of a KV type (docs/kv-snapshot-format.md).
pub(crate) fn kv_code(ty: KvType) -> u8 {
    match ty {
        KvType::F16 => 0,
        KvType::F32 => 1,
        KvType::Q8 => 2,
    }
}

fn padded<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let b = s.as_bytes();
    let n = b.len().min(N);
    out[..n].copy_from_slice(&b[..n]);
    out
}

fn unpadded(b: &[u8]) -> Result<String, KvStoreError> {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    if b[end..].iter().any(|&x| x != 0) {
        return Err(KvStoreError::Corrupt("text field not NUL-padded".into()));
    }
    String::from_utf8(b[..end].to_vec())
        .map_err(|_| KvStoreError::Corrupt("text field is not UTF-8".into()))
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

/// Section sizes (tokens, KV rows, recurrent state) implied by the shape fields, or `None`
/// on overflow.
fn section_sizes(c: &Compat, n_tokens: u64) -> Option<(u64, u64, u64)> {
    let n = usize::try_from(n_tokens).ok()?;
    let kv = SessionState::kv_bytes(c.kv_type, c.n_layer as usize, c.kv_row as usize, n)?;
    let state = u64::from(c.state.0)
        .checked_mul(u64::from(c.state.1))?
        .checked_mul(4)?;
    Some((n_tokens.checked_mul(4)?, u64::try_from(kv).ok()?, state))
}

/// Checks that the state has the shape `compat` describes.
fn check_shape(c: &Compat, state: &SessionState) -> Result<(), KvStoreError> {
    state.check()?;
    let same = state.kv_type == c.kv_type
        && state.n_layer == c.n_layer as usize
        && state.row == c.kv_row as usize
        && state
            .logits
            .as_ref()
            .is_none_or(|l| l.len() == c.n_vocab as usize)
        && (state.n_tokens() as u64) <= c.ctx
        && (state.recurrent.slots, state.recurrent.len) == (c.state.0 as usize, c.state.1 as usize);
    if !same {
        return Err(KvStoreError::Corrupt(
            "the session state does not have the shape its header describes".into(),
        ));
    }
    Ok(())
}

/// Serializes `state` and `meta` under `compat` into `out` (header, then payload).
pub fn encode(
    compat: &Compat,
    state: &SessionState,
    meta: &[u8],
    out: &mut dyn Write,
) -> Result<(), KvStoreError> {
    check_shape(compat, state)?;
    let tokens: Vec<u8> = state.tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    let logits: Vec<u8> = state
        .logits
        .iter()
        .flatten()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .collect();
    let recurrent: Vec<u8> = state
        .recurrent
        .values
        .iter()
        .flat_map(|x| x.to_bits().to_le_bytes())
        .collect();
    let mut sha = Sha256::new();
    for part in [&tokens[..], &state.kv, &recurrent, &logits, meta] {
        sha.update(part);
    }
    let payload_sha: [u8; 32] = sha.finalize().into();
    let mut h = [0u8; HEADER_LEN];
    h[0..8].copy_from_slice(&MAGIC);
    h[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    h[16..48].copy_from_slice(&padded::<32>(FERRITE_VERSION));
    h[48..80].copy_from_slice(&compat.model_sha256);
    h[80..96].copy_from_slice(&padded::<16>(&compat.arch));
    h[96] = kv_code(compat.kv_type);
    h[97] = compat.precision;
    h[98] = compat.backend.code();
    h[100..104].copy_from_slice(&compat.n_layer.to_le_bytes());
    h[104..108].copy_from_slice(&compat.kv_row.to_le_bytes());
    h[108..112].copy_from_slice(&compat.n_vocab.to_le_bytes());
    h[112..120].copy_from_slice(&compat.ctx.to_le_bytes());
    h[120..128].copy_from_slice(&(state.n_tokens() as u64).to_le_bytes());
    h[128..136].copy_from_slice(&(tokens.len() as u64).to_le_bytes());
    h[136..144].copy_from_slice(&(state.kv.len() as u64).to_le_bytes());
    h[144..152].copy_from_slice(&(logits.len() as u64).to_le_bytes());
    h[152..160].copy_from_slice(&(meta.len() as u64).to_le_bytes());
    h[160..164].copy_from_slice(&compat.state.0.to_le_bytes());
    h[164..168].copy_from_slice(&compat.state.1.to_le_bytes());
    h[168..176].copy_from_slice(&(recurrent.len() as u64).to_le_bytes());
    h[176..HEADER_SEALED].copy_from_slice(&payload_sha);
    let header_sha: [u8; 32] = Sha256::digest(&h[..HEADER_SEALED]).into();
    h[HEADER_SEALED..].copy_from_slice(&header_sha);
    out.write_all(&h)?;
    for part in [&tokens[..], &state.kv, &recurrent, &logits, meta] {
        out.write_all(part)?;
    }
    Ok(())
}

/// Parses and validates a header against the file size, without comparing it to any
/// session. Fails on a bad magic, version, header checksum, or any length that does not
/// follow from the shape fields or does not add up to `file_len`.
pub fn parse_header(h: &[u8; HEADER_LEN], file_len: u64) -> Result<Header, KvStoreError> {
    if h[0..8] != MAGIC {
        return Err(KvStoreError::NotASnapshot);
    }
    let version = le_u32(h, 8);
    if version != FORMAT_VERSION {
        return Err(KvStoreError::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let header_sha: [u8; 32] = Sha256::digest(&h[..HEADER_SEALED]).into();
    if h[HEADER_SEALED..] != header_sha {
        return Err(KvStoreError::Corrupt("header checksum mismatch".into()));
    }
    if le_u32(h, 12) as usize != HEADER_LEN {
        return Err(KvStoreError::Corrupt("unexpected header length".into()));
    }
    let kv_type = match h[96] {
        0 => KvType::F16,
        1 => KvType::F32,
        2 => KvType::Q8,
        x => return Err(KvStoreError::Corrupt(format!("unknown KV type code {x}"))),
    };
    let backend = SnapshotBackend::from_code(h[98])
        .ok_or_else(|| KvStoreError::Corrupt(format!("unknown backend code {}", h[98])))?;
    if h[99] != 0 {
        return Err(KvStoreError::Corrupt("reserved byte is not zero".into()));
    }
    let mut model_sha256 = [0u8; 32];
    model_sha256.copy_from_slice(&h[48..80]);
    let compat = Compat {
        model_sha256,
        arch: unpadded(&h[80..96])?,
        precision: h[97],
        kv_type,
        ctx: le_u64(h, 112),
        n_layer: le_u32(h, 100),
        kv_row: le_u32(h, 104),
        n_vocab: le_u32(h, 108),
        backend,
        state: (le_u32(h, 160), le_u32(h, 164)),
    };
    let mut payload_sha256 = [0u8; 32];
    payload_sha256.copy_from_slice(&h[176..HEADER_SEALED]);
    let header = Header {
        ferrite_version: unpadded(&h[16..48])?,
        n_tokens: le_u64(h, 120),
        tokens_bytes: le_u64(h, 128),
        kv_bytes: le_u64(h, 136),
        state_bytes: le_u64(h, 168),
        logits_bytes: le_u64(h, 144),
        meta_bytes: le_u64(h, 152),
        payload_sha256,
        compat,
    };
    let c = &header.compat;
    if header.n_tokens > c.ctx {
        return Err(KvStoreError::Corrupt(format!(
            "{} tokens in a context of {}",
            header.n_tokens, c.ctx
        )));
    }
    let (tokens, kv, state) = section_sizes(c, header.n_tokens)
        .ok_or_else(|| KvStoreError::Corrupt("section sizes overflow".into()))?;
    if (header.tokens_bytes, header.kv_bytes, header.state_bytes) != (tokens, kv, state) {
        return Err(KvStoreError::Corrupt(
            "section lengths do not match the shape".into(),
        ));
    }
    let logits_ok = header.logits_bytes == 0
        || (header.n_tokens > 0 && header.logits_bytes == u64::from(c.n_vocab) * 4);
    if !logits_ok {
        return Err(KvStoreError::Corrupt("logits length is wrong".into()));
    }
    let total = [
        kv,
        state,
        header.logits_bytes,
        header.meta_bytes,
        HEADER_LEN as u64,
    ]
    .iter()
    .try_fold(tokens, |acc, &x| acc.checked_add(x));
    if total != Some(file_len) {
        return Err(KvStoreError::Corrupt(format!(
            "the header describes {total:?} bytes, the file has {file_len}"
        )));
    }
    Ok(header)
}

/// Compares a parsed header with what the restoring session needs.
pub fn check_compat(header: &Header, want: &Compat) -> Result<(), KvStoreError> {
    let got = &header.compat;
    let hex = |b: &[u8; 32]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
    let fields: [(&'static str, String, String); 11] = [
        (
            "ferrite version",
            FERRITE_VERSION.into(),
            header.ferrite_version.clone(),
        ),
        (
            "model sha256",
            hex(&want.model_sha256),
            hex(&got.model_sha256),
        ),
        ("architecture", want.arch.clone(), got.arch.clone()),
        (
            "weight precision",
            want.precision.to_string(),
            got.precision.to_string(),
        ),
        (
            "KV type",
            format!("{:?}", want.kv_type),
            format!("{:?}", got.kv_type),
        ),
        ("context size", want.ctx.to_string(), got.ctx.to_string()),
        (
            "layer count",
            want.n_layer.to_string(),
            got.n_layer.to_string(),
        ),
        (
            "KV row width",
            want.kv_row.to_string(),
            got.kv_row.to_string(),
        ),
        (
            "vocabulary size",
            want.n_vocab.to_string(),
            got.n_vocab.to_string(),
        ),
        (
            "backend",
            want.backend.name().into(),
            got.backend.name().into(),
        ),
        (
            "recurrent state",
            format!("{:?}", want.state),
            format!("{:?}", got.state),
        ),
    ];
    for (field, expected, found) in fields {
        if expected != found {
            return Err(KvStoreError::Mismatch {
                field,
                expected,
                found,
            });
        }
    }
    Ok(())
}

fn read_exact_vec(r: &mut dyn Read, n: u64) -> Result<Vec<u8>, KvStoreError> {
    let n = usize::try_from(n).map_err(|_| KvStoreError::Corrupt("section too large".into()))?;
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| KvStoreError::Corrupt("section too large to allocate".into()))?;
    v.resize(n, 0);
    r.read_exact(&mut v).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => KvStoreError::Corrupt("file truncated".into()),
        _ => KvStoreError::Io(e),
    })?;
    Ok(v)
}

/// Reads the header of a stream of `file_len` bytes.
pub fn read_header(r: &mut dyn Read, file_len: u64) -> Result<Header, KvStoreError> {
    if file_len < HEADER_LEN as u64 {
        return Err(KvStoreError::Corrupt(format!(
            "{file_len} bytes is shorter than the header"
        )));
    }
    let mut h = [0u8; HEADER_LEN];
    r.read_exact(&mut h)?;
    parse_header(&h, file_len)
}

/// Decodes a whole snapshot of `file_len` bytes, requiring it to match `want`. The
/// payload is allocated only after the header proved its size equals the file's, and
/// is used only after its checksum matched.
pub fn decode(r: &mut dyn Read, file_len: u64, want: &Compat) -> Result<Snapshot, KvStoreError> {
    let header = read_header(r, file_len)?;
    check_compat(&header, want)?;
    let payload = read_exact_vec(r, header.payload_len())?;
    let sha: [u8; 32] = Sha256::digest(&payload).into();
    if sha != header.payload_sha256 {
        return Err(KvStoreError::Corrupt("payload checksum mismatch".into()));
    }
    let t = header.tokens_bytes as usize;
    let k = t + header.kv_bytes as usize;
    let st = k + header.state_bytes as usize;
    let l = st + header.logits_bytes as usize;
    let tokens: Vec<u32> = payload[..t]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    if let Some(bad) = tokens.iter().find(|&&x| x >= want.n_vocab) {
        return Err(KvStoreError::Corrupt(format!(
            "token id {bad} outside the vocabulary"
        )));
    }
    let f32s = |b: &[u8]| -> Vec<f32> {
        b.chunks_exact(4)
            .map(|b| f32::from_bits(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
            .collect()
    };
    let recurrent = ferrite_model::Recurrent {
        slots: want.state.0 as usize,
        len: want.state.1 as usize,
        values: f32s(&payload[k..st]),
    };
    let logits = (l > st).then(|| f32s(&payload[st..l]));
    let meta = payload[l..].to_vec();
    let mut kv = payload;
    kv.truncate(k);
    kv.drain(..t);
    Ok(Snapshot {
        state: SessionState {
            kv_type: want.kv_type,
            n_layer: want.n_layer as usize,
            row: want.kv_row as usize,
            tokens,
            kv,
            logits,
            recurrent,
        },
        meta,
    })
}

/// Reads only the header and the token ids (no payload checksum: for indexing a cache;
/// a restore goes through [`decode`], which checks everything).
pub fn read_tokens(
    r: &mut dyn Read,
    file_len: u64,
    want: &Compat,
) -> Result<Vec<u32>, KvStoreError> {
    let header = read_header(r, file_len)?;
    check_compat(&header, want)?;
    let raw = read_exact_vec(r, header.tokens_bytes)?;
    Ok(raw
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A compat block and a matching synthetic state of `n` tokens.
    pub(crate) fn sample(n: usize, ty: KvType, logits: bool) -> (Compat, SessionState) {
        let compat = Compat {
            model_sha256: [7; 32],
            arch: "llama".into(),
            precision: 0,
            kv_type: ty,
            ctx: 64,
            n_layer: 3,
            kv_row: 5,
            n_vocab: 11,
            backend: SnapshotBackend::Cpu,
            state: (0, 0),
        };
        let bytes = SessionState::kv_bytes(ty, 3, 5, n).unwrap();
        let state = SessionState {
            kv_type: ty,
            n_layer: 3,
            row: 5,
            tokens: (0..n as u32).map(|i| i % 11).collect(),
            kv: (0..bytes).map(|i| (i * 31 % 251) as u8).collect(),
            logits: logits.then(|| (0..11).map(|i| i as f32 * -0.5).collect()),
            recurrent: Default::default(),
        };
        (compat, state)
    }

    pub(crate) fn bytes_of(compat: &Compat, state: &SessionState, meta: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(compat, state, meta, &mut out).unwrap();
        out
    }

    fn dec(bytes: &[u8], want: &Compat) -> Result<Snapshot, KvStoreError> {
        decode(&mut &bytes[..], bytes.len() as u64, want)
    }

    #[test]
    fn round_trips_bit_exactly() {
        for ty in [KvType::F16, KvType::F32, KvType::Q8] {
            for (n, logits) in [(0, false), (1, true), (9, false), (9, true)] {
                let (c, s) = sample(n, ty, logits);
                let b = bytes_of(&c, &s, b"meta");
                assert_eq!(
                    b.len(),
                    HEADER_LEN + 4 * n + s.kv.len() + 44 * usize::from(logits) + 4
                );
                let back = dec(&b, &c).unwrap();
                assert_eq!((back.state, back.meta), (s.clone(), b"meta".to_vec()));
                assert_eq!(
                    read_tokens(&mut &b[..], b.len() as u64, &c).unwrap(),
                    s.tokens
                );
            }
        }
    }

    #[test]
    fn every_compat_field_is_enforced() {
        let (c, s) = sample(4, KvType::F16, true);
        let b = bytes_of(&c, &s, &[]);
        let variants: Vec<(&str, Compat)> = vec![
            (
                "model sha256",
                Compat {
                    model_sha256: [8; 32],
                    ..c.clone()
                },
            ),
            (
                "architecture",
                Compat {
                    arch: "gemma3".into(),
                    ..c.clone()
                },
            ),
            (
                "weight precision",
                Compat {
                    precision: 1,
                    ..c.clone()
                },
            ),
            (
                "KV type",
                Compat {
                    kv_type: KvType::F32,
                    ..c.clone()
                },
            ),
            (
                "context size",
                Compat {
                    ctx: 128,
                    ..c.clone()
                },
            ),
            (
                "layer count",
                Compat {
                    n_layer: 4,
                    ..c.clone()
                },
            ),
            (
                "KV row width",
                Compat {
                    kv_row: 6,
                    ..c.clone()
                },
            ),
            (
                "vocabulary size",
                Compat {
                    n_vocab: 12,
                    ..c.clone()
                },
            ),
            (
                "backend",
                Compat {
                    backend: SnapshotBackend::Cuda,
                    ..c.clone()
                },
            ),
            (
                "recurrent state",
                Compat {
                    state: (2, 3),
                    ..c.clone()
                },
            ),
        ];
        for (name, want) in variants {
            match dec(&b, &want) {
                Err(KvStoreError::Mismatch { field, .. }) => assert_eq!(field, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        // Another ferrite version: patch the field and reseal the header checksum.
        let mut v = b.clone();
        v[16..48].copy_from_slice(&padded::<32>("0.0.0-other"));
        reseal(&mut v);
        assert!(matches!(
            dec(&v, &c),
            Err(KvStoreError::Mismatch {
                field: "ferrite version",
                ..
            })
        ));
        // Version 1 files (no backend byte) and version 2 files (no recurrent state) are
        // refused, not guessed: a version error, which caches leave alone rather than delete.
        for found in [1, 2, 4] {
            let mut v = b.clone();
            v[8] = found as u8;
            reseal(&mut v);
            assert!(
                matches!(dec(&v, &c), Err(KvStoreError::Version { found: f, .. }) if f == found)
            );
        }
    }

    #[test]
    fn a_recurrent_state_round_trips_and_its_shape_is_checked() {
        let (mut c, mut s) = sample(5, KvType::F32, true);
        c.state = (2, 3);
        s.recurrent = ferrite_model::Recurrent {
            slots: 2,
            len: 3,
            values: vec![0.5, -1.0, 2.0, f32::MIN_POSITIVE, -0.0, 7.25],
        };
        let b = bytes_of(&c, &s, b"m");
        assert_eq!(b.len(), HEADER_LEN + 20 + s.kv.len() + 24 + 44 + 1);
        let back = dec(&b, &c).unwrap().state;
        assert_eq!(back, s);
        assert!(
            back.recurrent.values[4].is_sign_negative(),
            "bits, not values"
        );
        // A state of another shape than the header says is refused before writing.
        let mut wrong = s.clone();
        wrong.recurrent.len = 2;
        assert!(encode(&c, &wrong, b"", &mut Vec::new()).is_err());
        // A header whose state length disagrees with its shape fields is damage.
        let mut v = b.clone();
        v[168] ^= 4;
        reseal(&mut v);
        assert!(dec(&v, &c).unwrap_err().is_corrupt());
    }

    #[test]
    fn snapshots_are_refused_on_the_other_backend() {
        // A CUDA-written file read by a CPU session and the reverse: valid files, the
        // backend field differs, so a mismatch (left in place by caches, not deleted).
        let (cpu, s) = sample(5, KvType::F16, true);
        let cuda = Compat {
            backend: SnapshotBackend::Cuda,
            ..cpu.clone()
        };
        for (writer, reader) in [(&cuda, &cpu), (&cpu, &cuda)] {
            let b = bytes_of(writer, &s, b"m");
            assert_eq!(b[98], writer.backend.code());
            assert_eq!(dec(&b, writer).unwrap().state, s);
            match dec(&b, reader) {
                Err(
                    e @ KvStoreError::Mismatch {
                        field: "backend", ..
                    },
                ) => assert!(!e.is_corrupt()),
                other => panic!("{other:?}"),
            }
            let err = read_tokens(&mut &b[..], b.len() as u64, reader).unwrap_err();
            assert!(matches!(
                err,
                KvStoreError::Mismatch {
                    field: "backend",
                    ..
                }
            ));
        }
        // An unknown backend code with a valid checksum is damage, as is a set reserved byte.
        let b = bytes_of(&cpu, &s, b"");
        for (at, x) in [(98, 2u8), (99, 1)] {
            let mut v = b.clone();
            v[at] = x;
            reseal(&mut v);
            assert!(dec(&v, &cpu).unwrap_err().is_corrupt(), "byte {at}");
        }
    }

    /// Recomputes the header checksum after a test edited header fields.
    pub(crate) fn reseal(b: &mut [u8]) {
        let sha: [u8; 32] = Sha256::digest(&b[..HEADER_SEALED]).into();
        b[HEADER_SEALED..HEADER_LEN].copy_from_slice(&sha);
    }

    #[test]
    fn damaged_files_are_corrupt() {
        let (c, s) = sample(6, KvType::F32, true);
        let b = bytes_of(&c, &s, b"xy");
        for cut in [
            0,
            10,
            HEADER_LEN - 1,
            HEADER_LEN,
            HEADER_LEN + 7,
            b.len() - 1,
        ] {
            let err = dec(&b[..cut], &c).unwrap_err();
            assert!(err.is_corrupt(), "cut {cut}: {err}");
        }
        let mut longer = b.clone();
        longer.push(0);
        assert!(dec(&longer, &c).unwrap_err().is_corrupt());
        let mut flipped = b.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x40;
        assert!(
            matches!(dec(&flipped, &c), Err(KvStoreError::Corrupt(m)) if m.contains("payload checksum"))
        );
        let mut hdr = b.clone();
        hdr[120] ^= 1;
        assert!(
            matches!(dec(&hdr, &c), Err(KvStoreError::Corrupt(m)) if m.contains("header checksum"))
        );
        // Lengths that exceed the file, with a valid header checksum.
        let mut big = b.clone();
        big[120..128].copy_from_slice(&60u64.to_le_bytes());
        big[128..136].copy_from_slice(&240u64.to_le_bytes());
        reseal(&mut big);
        assert!(dec(&big, &c).unwrap_err().is_corrupt());
        let mut magic = b.clone();
        magic[0] = b'X';
        assert!(matches!(dec(&magic, &c), Err(KvStoreError::NotASnapshot)));
    }

    #[test]
    fn encode_refuses_states_that_do_not_fit_the_header() {
        let (c, mut s) = sample(3, KvType::F16, false);
        s.kv.pop();
        assert!(encode(&c, &s, &[], &mut Vec::new()).is_err());
        let (c, s) = sample(3, KvType::F16, false);
        let small = Compat { ctx: 2, ..c };
        assert!(encode(&small, &s, &[], &mut Vec::new()).is_err());
    }
}
