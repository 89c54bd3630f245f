//! JSON mode: sampling held to one JSON object (OpenAI's `response_format` `json_object`),
//! or to a JSON schema (`json_schema`), token by token, through the byte grammar of
//! [`crate::json_schema_prefix`] (JSON mode's is the schema of any object). The JSON text
//! may be framed by fixed text before and after it: a tool call in its model's markup.
//!
//! Each step samples the raw row first and keeps the token when its bytes continue the
//! text; otherwise every token that cannot continue it is set to `-inf` and the sampler
//! runs again on that row (llama.cpp's grammar sampling does the same). Greedy decoding
//! thus takes the best allowed token, and sampling without top-k, top-p or min-p cuts
//! draws from the masked distribution exactly; with cuts, an allowed first draw from the
//! unmasked cut is kept. Once the text is whole (the object closed, and the text after it
//! written), only end-of-generation tokens are allowed, and they are allowed only then.
//!
//! Never changes the logits a caller reports: log-probabilities stay those of the raw row.

use std::sync::Arc;

use crate::json_schema::JsonSchema;
use crate::json_schema_prefix::SchemaPrefix;
use crate::sampler::{SampleError, Sampler, argmax};

/// What the output is held to: fixed text, a value of a compiled schema
/// ([`JsonSchema::any_object`] for JSON mode), then fixed text.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonGrammar {
    schema: Arc<JsonSchema>,
    before: Vec<u8>,
    after: Vec<u8>,
}

/// How far a [`JsonGrammar`]'s text has got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonState {
    /// Bytes of the text before the JSON written so far.
    before: usize,
    json: SchemaPrefix,
    /// Bytes of the text after the JSON still to come.
    after_left: usize,
}

impl JsonState {
    /// Whether the text is whole.
    pub fn is_complete(&self) -> bool {
        self.json.is_complete() && self.after_left == 0
    }

    /// Whether the next byte lands in the text of one of the JSON's strings.
    fn in_string_text(&self) -> bool {
        self.json.in_string_text()
    }
}

impl JsonGrammar {
    /// Output held to `schema`.
    pub fn new(schema: Arc<JsonSchema>) -> JsonGrammar {
        JsonGrammar::framed(schema, "", "")
    }

    /// Output held to one JSON object of any content (JSON mode).
    pub fn any_object() -> JsonGrammar {
        JsonGrammar::new(Arc::new(JsonSchema::any_object()))
    }

    /// Output held to `before`, a value of `schema`, then `after`, each exactly.
    pub fn framed(schema: Arc<JsonSchema>, before: &str, after: &str) -> JsonGrammar {
        JsonGrammar {
            schema,
            before: before.as_bytes().to_vec(),
            after: after.as_bytes().to_vec(),
        }
    }

    /// The state of empty output.
    pub fn start(&self) -> JsonState {
        JsonState {
            before: 0,
            json: SchemaPrefix::new(),
            after_left: self.after.len(),
        }
    }

    /// `state` extended by `bytes`, or `None` when the grammar has no text starting so.
    /// `state` must come from this grammar.
    pub fn feed(&self, mut state: JsonState, mut bytes: &[u8]) -> Option<JsonState> {
        if state.before < self.before.len() {
            let n = bytes.len().min(self.before.len() - state.before);
            (bytes[..n] == self.before[state.before..state.before + n]).then_some(())?;
            state.before += n;
            bytes = &bytes[n..];
        }
        if bytes.is_empty() {
            return Some(state);
        }
        if !state.json.is_complete() {
            let (json, took) = state.json.feed_to_end(&self.schema, bytes)?;
            state.json = json;
            bytes = &bytes[took..];
        }
        if bytes.is_empty() {
            return Some(state);
        }
        // The JSON is whole: the rest must continue the text after it.
        let rest = &self.after[self.after.len() - state.after_left..];
        rest.starts_with(bytes).then_some(())?;
        state.after_left -= bytes.len();
        Some(state)
    }
}

/// What JSON mode needs of a vocabulary: each token's bytes and the end-of-generation ids.
#[derive(Debug)]
pub struct JsonVocab {
    data: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is token i's bytes; empty for tokens that are never text.
    offsets: Vec<usize>,
    eog: Vec<u32>,
    /// Whether each token's bytes are all plain string text (no quote, backslash or control
    /// byte): inside a string's text, such a token leaves the state as it is.
    plain: Vec<bool>,
}

impl JsonVocab {
    /// A vocabulary from each token's bytes in id order (empty for control tokens, which
    /// JSON mode never emits) and the ids that end generation.
    pub fn new<B: AsRef<[u8]>>(tokens: impl IntoIterator<Item = B>, eog: Vec<u32>) -> JsonVocab {
        let mut data = Vec::new();
        let mut offsets = vec![0];
        let mut plain = Vec::new();
        for t in tokens {
            let t = t.as_ref();
            data.extend_from_slice(t);
            offsets.push(data.len());
            plain.push(t.iter().all(|&b| b >= 0x20 && b != b'"' && b != b'\\'));
        }
        JsonVocab {
            data,
            offsets,
            eog,
            plain,
        }
    }

    /// Token `i`'s bytes, `None` past the vocabulary.
    fn bytes(&self, i: usize) -> Option<&[u8]> {
        Some(&self.data[*self.offsets.get(i)?..*self.offsets.get(i + 1)?])
    }

    /// The state after `token`, or `None` when `token` cannot follow `state` in `grammar`. A
    /// token with no bytes never can (it would make no progress), except an
    /// end-of-generation token once the text is complete.
    pub fn advance(
        &self,
        grammar: &JsonGrammar,
        state: JsonState,
        token: u32,
    ) -> Option<JsonState> {
        if self.eog.contains(&token) {
            return state.is_complete().then_some(state);
        }
        let bytes = self.bytes(token as usize)?;
        if bytes.is_empty() {
            return None;
        }
        grammar.feed(state, bytes)
    }

    /// Sets the logit of every token that cannot follow `state` in `grammar` to `-inf`;
    /// returns how many tokens remain.
    pub fn mask(&self, grammar: &JsonGrammar, state: JsonState, logits: &mut [f32]) -> usize {
        // What `advance` decides, with two shortcuts that spare most tokens the copy of the
        // state and the walk: a token whose first byte cannot come next is refused, and
        // inside a string's text a token of plain text is taken.
        let opens: [bool; 256] = std::array::from_fn(|b| grammar.feed(state, &[b as u8]).is_some());
        let in_text = state.in_string_text();
        let allows = |id: usize| -> bool {
            if self.eog.contains(&(id as u32)) {
                return state.is_complete();
            }
            match self.bytes(id) {
                Some([]) | None => false,
                Some(_) if in_text && self.plain[id] => true,
                Some(bytes) => opens[bytes[0] as usize] && grammar.feed(state, bytes).is_some(),
            }
        };
        let mut allowed = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if allows(id) {
                allowed += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        allowed
    }
}

/// JSON mode's errors.
#[derive(Debug, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum JsonModeError {
    /// The sampler failed on the row.
    #[error(transparent)]
    Sample(#[from] SampleError),
    /// No token of the vocabulary continues the text (a vocabulary without the bytes JSON
    /// needs, or without an end-of-generation token).
    #[error("JSON mode: no token of the vocabulary can continue the JSON text")]
    NoToken,
}

/// What a request or a run draws its tokens with: a sampler, free or held to a grammar.
// One per request or run, made once and never copied: the variants' sizes do not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Chooser {
    /// Any token the sampler draws.
    Free(Sampler),
    /// Tokens held to a grammar.
    Held(JsonSampler),
}

impl Chooser {
    /// The next token from a row of logits ([`Sampler::next_token`] or
    /// [`JsonSampler::next_token`]).
    pub fn next_token(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, JsonModeError> {
        match self {
            Chooser::Free(s) => Ok(s.next_token(logits, history)?),
            Chooser::Held(s) => s.next_token(logits, history),
        }
    }

    /// Ready for a fresh output, such as the next reply of a chat: a held chooser's grammar
    /// starts over; the sampler's random stream carries on, as it does for a free one.
    pub fn restart(&mut self) {
        if let Chooser::Held(s) = self {
            s.state = s.grammar.start();
        }
    }
}

/// A sampler held to a [`JsonGrammar`].
#[derive(Debug)]
pub struct JsonSampler {
    sampler: Sampler,
    vocab: Arc<JsonVocab>,
    grammar: JsonGrammar,
    state: JsonState,
    masked: Vec<f32>,
}

impl JsonSampler {
    /// Holds `sampler` to `grammar` over `vocab`, starting from empty output.
    pub fn new(sampler: Sampler, vocab: Arc<JsonVocab>, grammar: JsonGrammar) -> JsonSampler {
        JsonSampler {
            sampler,
            vocab,
            state: grammar.start(),
            grammar,
            masked: Vec::new(),
        }
    }

    /// The next token (see the module documentation). `history` is as for
    /// [`Sampler::next_token`].
    pub fn next_token(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, JsonModeError> {
        let first = self.sampler.next_token(logits, history)?;
        if let Some(next) = self.vocab.advance(&self.grammar, self.state, first) {
            self.state = next;
            return Ok(first);
        }
        self.masked.clear();
        self.masked.extend_from_slice(logits);
        if self.vocab.mask(&self.grammar, self.state, &mut self.masked) == 0 {
            return Err(JsonModeError::NoToken);
        }
        let drawn = self.sampler.next_token(&self.masked, history)?;
        // A draw's rounding can land past the last candidate with weight, on a masked one:
        // the best allowed token (greedy's choice on the masked row) stands in for it.
        let token = match self.vocab.advance(&self.grammar, self.state, drawn) {
            Some(_) => drawn,
            None => argmax(&self.masked),
        };
        self.state = self
            .vocab
            .advance(&self.grammar, self.state, token)
            .ok_or(JsonModeError::NoToken)?;
        Ok(token)
    }

    /// The sampler that draws each token.
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// Whether the output so far is whole.
    pub fn is_complete(&self) -> bool {
        self.state.is_complete()
    }
}

#[cfg(test)]
mod tests;
