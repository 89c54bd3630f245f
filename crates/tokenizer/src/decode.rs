//! Turning ids back into text: a flat table of each token's bytes, full decoding, and the
//! incremental [`StreamDecoder`].
//!
//! Both paths follow `String::from_utf8_lossy` over the concatenated bytes: an invalid sequence
//! becomes one U+FFFD, and a sequence cut short at the end becomes one U+FFFD. The streaming
//! decoder holds back a possibly incomplete tail, so its output concatenated equals the full
//! decode exactly, whatever the chunk boundaries.

use crate::error::{Result, TokenizerError};

/// Every token's bytes, stored contiguously, plus which tokens are control tokens.
#[derive(Debug)]
pub(crate) struct TokenBytes {
    data: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is token i's bytes.
    offsets: Vec<usize>,
    control: Vec<bool>,
}

impl TokenBytes {
    /// Build from each token's bytes and whether it is a control token.
    pub(crate) fn new(items: impl Iterator<Item = (Vec<u8>, bool)>) -> Self {
        let mut data = Vec::new();
        let mut offsets = vec![0];
        let mut control = Vec::new();
        for (bytes, is_control) in items {
            data.extend_from_slice(&bytes);
            offsets.push(data.len());
            control.push(is_control);
        }
        Self {
            data,
            offsets,
            control,
        }
    }

    /// The bytes token `id` stands for, or an empty slice for a hidden control token.
    pub(crate) fn get(&self, id: u32, show_special: bool) -> Result<&[u8]> {
        let i = id as usize;
        let (Some(&start), Some(&end), Some(&control)) = (
            self.offsets.get(i),
            self.offsets.get(i + 1),
            self.control.get(i),
        ) else {
            return Err(TokenizerError::BadTokenId {
                id,
                vocab_size: self.control.len(),
            });
        };
        if control && !show_special {
            return Ok(&[]);
        }
        Ok(&self.data[start..end])
    }
}

/// Move the decodable prefix of `pending` into `out`, as `from_utf8_lossy` would render it.
/// An incomplete sequence at the end stays in `pending` unless `flush` is set.
fn drain_utf8(pending: &mut Vec<u8>, out: &mut String, flush: bool) {
    let mut consumed = 0;
    loop {
        let rest = &pending[consumed..];
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                consumed = pending.len();
                break;
            }
            Err(e) => {
                let valid = e.valid_up_to();
                out.push_str(std::str::from_utf8(&rest[..valid]).unwrap_or_default());
                match e.error_len() {
                    Some(n) => {
                        out.push(char::REPLACEMENT_CHARACTER);
                        consumed += valid + n;
                    }
                    None => {
                        consumed += valid;
                        if flush {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed = pending.len();
                        }
                        break;
                    }
                }
            }
        }
    }
    pending.drain(..consumed);
}

/// Decode ids to text (lossy UTF-8).
pub(crate) fn decode(table: &TokenBytes, ids: &[u32], show_special: bool) -> Result<String> {
    let mut bytes = Vec::new();
    for &id in ids {
        bytes.extend_from_slice(table.get(id, show_special)?);
    }
    let mut out = String::with_capacity(bytes.len());
    drain_utf8(&mut bytes, &mut out, true);
    Ok(out)
}

/// Incremental decoder: feed ids one at a time, get text as soon as it is complete UTF-8.
///
/// It never emits part of a character and never loses bytes at chunk boundaries: the
/// concatenation of every [`push`](Self::push) result and [`finish`](Self::finish) equals
/// [`crate::Tokenizer::decode`] of all the ids.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    table: &'a TokenBytes,
    show_special: bool,
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(table: &'a TokenBytes, show_special: bool) -> Self {
        Self {
            table,
            show_special,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.pending
            .extend_from_slice(self.table.get(id, self.show_special)?);
        let mut out = String::new();
        drain_utf8(&mut self.pending, &mut out, false);
        Ok(out)
    }

    /// End of stream: returns what is left (an incomplete trailing character becomes U+FFFD).
    pub fn finish(mut self) -> String {
        let mut out = String::new();
        drain_utf8(&mut self.pending, &mut out, true);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pieces: &[&[u8]]) -> TokenBytes {
        TokenBytes::new(pieces.iter().map(|p| (p.to_vec(), false)))
    }

    fn stream_all(t: &TokenBytes, ids: &[u32]) -> (Vec<String>, String) {
        let mut d = StreamDecoder::new(t, true);
        let mut chunks: Vec<String> = ids.iter().map(|&id| d.push(id).expect("id")).collect();
        chunks.push(d.finish());
        let joined = chunks.concat();
        (chunks, joined)
    }

    #[test]
    fn stream_holds_partial_characters() {
        // "😀" = F0 9F 98 80 split over three tokens, then "中" = E4 B8 AD over two.
        let t = table(&[b"\xF0", b"\x9F\x98", b"\x80a", b"\xE4\xB8", b"\xAD"]);
        let ids = [0, 1, 2, 3, 4];
        let (chunks, joined) = stream_all(&t, &ids);
        assert_eq!(chunks, ["", "", "😀a", "", "中", ""]);
        assert_eq!(joined, decode(&t, &ids, true).expect("decode"));
    }

    #[test]
    fn stream_matches_lossy_decode_on_invalid_bytes() {
        let t = table(&[b"\xFF", b"\xE4\xB8", b"x", b"\xF0\x9F"]);
        for ids in [vec![0, 2], vec![1, 2], vec![1], vec![2, 3], vec![3, 3]] {
            let full = decode(&t, &ids, true).expect("decode");
            assert_eq!(
                full,
                String::from_utf8_lossy(
                    &ids.iter()
                        .flat_map(|&i| t.get(i, true).unwrap_or_default().to_vec())
                        .collect::<Vec<_>>()
                )
            );
            assert_eq!(stream_all(&t, &ids).1, full, "ids {ids:?}");
        }
    }

    #[test]
    fn control_tokens_hidden_on_request_and_bad_ids_rejected() {
        let t = TokenBytes::new([(b"<s>".to_vec(), true), (b"x".to_vec(), false)].into_iter());
        assert_eq!(decode(&t, &[0, 1], true).expect("decode"), "<s>x");
        assert_eq!(decode(&t, &[0, 1], false).expect("decode"), "x");
        assert!(matches!(
            decode(&t, &[2], true),
            Err(TokenizerError::BadTokenId {
                id: 2,
                vocab_size: 2
            })
        ));
    }
}
