//! SentencePiece `tokenizer.model` → GGUF `tokenizer.*` metadata (`tokenizer.ggml.model =
//! "llama"`), as llama.cpp's converter writes it for Llama 2 / Mistral-style tokenizers.
//!
//! The file is a protobuf `ModelProto`; only its repeated field 1 (`pieces`: piece text,
//! score, type) is needed, so this module decodes the wire format directly instead of
//! depending on a protobuf library. Every length is checked against the bytes left.
//! Then, as llama.cpp does: ids past the pieces up to `vocab_size` are `[PAD<i>]` (unused,
//! score -10000); `added_tokens.json` entries become user-defined (score -1000);
//! `tokenizer_config.json`'s `added_tokens_decoder` entries become control tokens when
//! special (or special-looking) and user-defined otherwise (score -1000).

use std::path::Path;

use ferrite_gguf::{Array, Value};
use serde_json::Value as Json;

use crate::ConvertError;
use crate::tokenizer::{looks_special, read_json};

/// One vocabulary entry of a SentencePiece model.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Piece {
    pub text: String,
    pub score: f32,
    /// SentencePiece's type numbering, which llama.cpp's token types share: 1 normal,
    /// 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
    pub kind: i32,
}

fn err(msg: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer(format!("tokenizer.model: {}", msg.into()))
}

/// A cursor over protobuf wire-format bytes.
struct Wire<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Wire<'a> {
    fn varint(&mut self) -> Result<u64, ConvertError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self
                .buf
                .get(self.pos)
                .ok_or_else(|| err("truncated varint"))?;
            self.pos += 1;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(err("varint longer than 10 bytes"))
    }

    fn take(&mut self, n: u64) -> Result<&'a [u8], ConvertError> {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| self.pos.checked_add(n))
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| err("field runs past the end of the file"))?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// The next field: number, wire type and, for length-delimited/fixed fields, the bytes
    /// (varints are returned as their value in `u64`).
    fn field(&mut self) -> Result<Option<(u64, Field<'a>)>, ConvertError> {
        if self.pos >= self.buf.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let f = match key & 7 {
            0 => Field::Varint(self.varint()?),
            1 => Field::Bytes(self.take(8)?),
            2 => {
                let n = self.varint()?;
                Field::Bytes(self.take(n)?)
            }
            5 => Field::Bytes(self.take(4)?),
            w => return Err(err(format!("unsupported wire type {w}"))),
        };
        Ok(Some((key >> 3, f)))
    }
}

enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
}

/// The pieces of a SentencePiece model file, in id order.
pub(crate) fn read_pieces(buf: &[u8]) -> Result<Vec<Piece>, ConvertError> {
    let mut top = Wire { buf, pos: 0 };
    let mut pieces = Vec::new();
    while let Some((num, f)) = top.field()? {
        let (1, Field::Bytes(msg)) = (num, f) else {
            continue;
        };
        let mut p = Piece {
            text: String::new(),
            score: 0.0,
            kind: 1,
        };
        let mut w = Wire { buf: msg, pos: 0 };
        while let Some((n, f)) = w.field()? {
            match (n, f) {
                (1, Field::Bytes(b)) => {
                    p.text =
                        String::from_utf8(b.to_vec()).map_err(|_| err("piece is not UTF-8"))?;
                }
                (2, Field::Bytes(b)) if b.len() == 4 => {
                    p.score = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
                (3, Field::Varint(v)) => {
                    p.kind = i32::try_from(v).map_err(|_| err("piece type out of range"))?;
                }
                _ => {}
            }
        }
        pieces.push(p);
    }
    if pieces.is_empty() {
        return Err(err("no pieces"));
    }
    Ok(pieces)
}

/// The three parallel `tokenizer.ggml.*` arrays, indexed by token id.
#[derive(Debug, PartialEq)]
pub(crate) struct Vocab {
    pub tokens: Vec<String>,
    pub scores: Vec<f32>,
    pub types: Vec<i32>,
}

/// Tokens, scores and types for a vocabulary of `n_vocab` ids.
pub(crate) fn vocabulary(
    dir: &Path,
    pieces: &[Piece],
    tok_cfg: &Json,
    n_vocab: usize,
) -> Result<Vocab, ConvertError> {
    let mut tokens: Vec<String> = (0..n_vocab).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n_vocab];
    let mut types = vec![5i32; n_vocab];
    for (i, p) in pieces.iter().enumerate().take(n_vocab) {
        tokens[i] = p.text.clone();
        scores[i] = p.score;
        // llama.cpp keeps unknown, control, unused and byte; everything else is normal.
        types[i] = if matches!(p.kind, 2 | 3 | 5 | 6) {
            p.kind
        } else {
            1
        };
    }
    if let Some(Json::Object(added)) = read_json(&dir.join("added_tokens.json"))? {
        for (text, id) in added {
            if let Some(id) = id.as_u64().map(|i| i as usize).filter(|&i| i < n_vocab) {
                tokens[id] = text;
                scores[id] = -1000.0;
                types[id] = 4;
            }
        }
    }
    if let Some(Json::Object(decoder)) = tok_cfg.get("added_tokens_decoder") {
        for (id, data) in decoder {
            let Some(id) = id.parse::<usize>().ok().filter(|&i| i < n_vocab) else {
                continue;
            };
            let Some(text) = data.get("content").and_then(Json::as_str) else {
                continue;
            };
            let special = data.get("special").and_then(Json::as_bool) == Some(true);
            if special || looks_special(text) {
                types[id] = 3;
                tokens[id] = text.to_owned();
            } else {
                types[id] = 4;
                tokens[id] = text.replace('\u{2581}', " ");
            }
            scores[id] = -1000.0;
        }
    }
    Ok(Vocab {
        tokens,
        scores,
        types,
    })
}

/// The `tokenizer.ggml.{model,pre,tokens,scores,token_type}` entries.
pub(crate) fn base_metadata(
    dir: &Path,
    model_path: &Path,
    tok_cfg: &Json,
    n_vocab: usize,
) -> Result<Vec<(String, Value)>, ConvertError> {
    let bytes = std::fs::read(model_path).map_err(|source| ConvertError::Io {
        path: model_path.display().to_string(),
        source,
    })?;
    let pieces = read_pieces(&bytes)?;
    let Vocab {
        tokens,
        scores,
        types,
    } = vocabulary(dir, &pieces, tok_cfg, n_vocab)?;
    Ok(vec![
        ("tokenizer.ggml.model".into(), Value::String("llama".into())),
        ("tokenizer.ggml.pre".into(), Value::String("default".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(Array::String(tokens.into_iter().collect())),
        ),
        (
            "tokenizer.ggml.scores".into(),
            Value::Array(Array::F32(scores)),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(Array::I32(types)),
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-encoded protobuf: field 1 pieces, plus an unrelated field 2 that must be skipped.
    fn model(pieces: &[(&str, f32, Option<u8>)]) -> Vec<u8> {
        let mut out = vec![0x12, 0x02, 0x08, 0x01]; // field 2 (trainer_spec), 2 bytes
        for (text, score, kind) in pieces {
            let mut msg = vec![0x0a, text.len() as u8];
            msg.extend_from_slice(text.as_bytes());
            msg.push(0x15);
            msg.extend_from_slice(&score.to_le_bytes());
            if let Some(k) = kind {
                msg.extend_from_slice(&[0x18, *k]);
            }
            out.push(0x0a);
            out.push(msg.len() as u8);
            out.extend(msg);
        }
        out
    }

    #[test]
    fn reads_pieces_scores_and_types() {
        let bytes = model(&[
            ("<unk>", 0.0, Some(2)),
            ("<s>", 0.0, Some(3)),
            ("▁a", -1.5, None),
        ]);
        let p = read_pieces(&bytes).unwrap();
        assert_eq!(p.len(), 3);
        assert_eq!((p[0].text.as_str(), p[0].kind), ("<unk>", 2));
        assert_eq!((p[2].text.as_str(), p[2].score, p[2].kind), ("▁a", -1.5, 1));
    }

    #[test]
    fn truncated_or_garbage_input_is_an_error_not_a_panic() {
        let bytes = model(&[("<unk>", 0.0, Some(2)), ("▁ab", -1.0, None)]);
        for cut in 0..bytes.len() {
            let _ = read_pieces(&bytes[..cut]);
        }
        assert!(
            read_pieces(&[
                0x0a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01
            ])
            .is_err()
        );
        assert!(read_pieces(&[0x0b]).is_err(), "wire type 3 is refused");
        assert!(read_pieces(&[]).is_err());
    }

    #[test]
    fn pads_and_applies_added_token_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let pieces = read_pieces(&model(&[
            ("<unk>", 0.0, Some(2)),
            ("<0x41>", 0.0, Some(6)),
            ("x", -1.0, None),
        ]))
        .unwrap();
        let cfg: Json = serde_json::from_str(
            r#"{"added_tokens_decoder":{"2":{"content":"<|x|>","special":false},"3":{"content":"a▁b"}}}"#,
        )
        .unwrap();
        let v = vocabulary(dir.path(), &pieces, &cfg, 5).unwrap();
        assert_eq!(v.tokens, ["<unk>", "<0x41>", "<|x|>", "a b", "[PAD4]"]);
        assert_eq!(v.types, [2, 6, 3, 4, 5]);
        assert_eq!(v.scores, [0.0, 0.0, -1000.0, -1000.0, -10000.0]);
    }
}
