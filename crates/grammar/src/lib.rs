//! ferrite-grammar: structured output through [llguidance]. It owns the three things a
//! held generation needs: a [`Vocab`] (llguidance's token trie and parser factory, built
//! once per model from ferrite's own token bytes), a [`Constraint`] (a JSON Schema, JSON
//! mode, a regex, a Lark or GBNF grammar, compiled and checked when a request is read), and a
//! [`Matcher`] (one generation's state: the mask of tokens that may come next, and the
//! tokens taken).
//!
//! The key design choice: a constraint is compiled twice. [`Constraint`]'s constructors
//! compile it against a 256-token byte vocabulary, so a front end refuses a grammar or
//! schema llguidance cannot enforce (naming the keyword) before it queues anything; the
//! engine compiles it again over the model's vocabulary with [`Matcher::new`]. Whatever
//! the first compile accepts the second does, since llguidance's grammar compiler never
//! reads the vocabulary.
//!
//! A schema's JSON is always compact with the separators `json.dumps` writes (`", "`,
//! `": "`) and no other whitespace: a model can never pad its output with runs of blanks.
//! An object whose schema lists properties and says nothing of `additionalProperties` is
//! closed, as llama.cpp and xgrammar read it. JSON mode takes blanks as a model writes them,
//! in runs of bounded length, and numbers of bounded length, so a model cannot run on in
//! blanks or digits (all in `json.rs`).
//!
//! Never samples and never touches logits beyond masking them: choosing a token is the
//! engine's.
//!
//! ```
//! use ferrite_grammar::{Constraint, Matcher, Token, Vocab};
//! // A vocabulary of the 256 bytes and one end-of-generation token.
//! let mut tokens: Vec<Token> = (0..=255u8).map(|b| Token::Text(vec![b])).collect();
//! tokens.push(Token::Special("<eos>".into()));
//! let vocab = Vocab::new(tokens, &[256]).unwrap();
//! let c = Constraint::regex("ab?").unwrap();
//! let mut m = Matcher::new(&vocab, &c).unwrap();
//! let mut row = vec![0.0f32; 257];
//! assert_eq!(m.mask(&mut row).unwrap(), 1); // only "a"
//! m.accept(u32::from(b'a')).unwrap();
//! assert!(m.is_accepting());
//! ```

#![deny(missing_docs)]

mod gbnf;
mod json;

use std::fmt;
use std::sync::{Arc, OnceLock};

use llguidance::ParserFactory;
use llguidance::api::{GrammarWithLexer, TopLevelGrammar};
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use serde_json::Value;

/// Errors of this crate.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum GrammarError {
    /// llguidance refused the constraint; the message names the cause (an unimplemented
    /// keyword, an unknown format, a syntax error).
    #[error("{0}")]
    Invalid(String),
    /// A vocabulary with no tokens or with no end-of-generation token.
    #[error("a vocabulary needs tokens and an end-of-generation token")]
    EmptyVocab,
    /// A token id past the vocabulary.
    #[error("token {0} is not in the vocabulary")]
    UnknownToken(u32),
    /// The grammar refused a token it was given, or could not go on.
    #[error("the grammar cannot go on: {0}")]
    Stuck(String),
}

/// One vocabulary entry as the trie reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// A token that is text: its bytes (a byte-fallback token is its one byte).
    Text(Vec<u8>),
    /// A control token, by its piece (`<|im_end|>`): never text, so never matched by a
    /// grammar's strings; Lark names it as `<|im_end|>`.
    Special(String),
}

/// A model's vocabulary as llguidance reads it, with the parser factory over it (its
/// token-slicing tables are the costly part; build one per model and share it).
#[derive(Clone)]
pub struct Vocab {
    factory: Arc<ParserFactory>,
}

impl fmt::Debug for Vocab {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Vocab").field("size", &self.size()).finish()
    }
}

impl Vocab {
    /// The vocabulary of `tokens` in id order, whose `eog` ids end generation (a grammar
    /// allows them only where it accepts).
    pub fn new(tokens: Vec<Token>, eog: &[u32]) -> Result<Vocab, GrammarError> {
        let eog: Vec<u32> = eog
            .iter()
            .copied()
            .filter(|&t| (t as usize) < tokens.len())
            .collect();
        let (Some(&eos), false) = (eog.first(), tokens.is_empty()) else {
            return Err(GrammarError::EmptyVocab);
        };
        let words: Vec<Vec<u8>> = tokens
            .into_iter()
            .enumerate()
            .map(|(id, t)| match t {
                Token::Text(bytes) if !bytes.is_empty() => bytes,
                // A special token's trie entry starts with the marker byte no text has.
                Token::Special(piece) if !piece.is_empty() => special_word(piece.as_bytes()),
                _ => special_word(format!("<[{id}]>").as_bytes()),
            })
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        Vocab::over(Arc::new(ApproximateTokEnv::new(trie)))
    }

    /// The byte vocabulary with these control tokens after it: what a grammar naming them
    /// is checked against when it is made.
    fn bytes_and(specials: Vec<String>) -> Result<Vocab, GrammarError> {
        let mut tokens: Vec<Token> = (0..=255).map(|b| Token::Text(vec![b])).collect();
        tokens.extend(specials.into_iter().map(Token::Special));
        // An end of generation of its own, so the specials named stay what they are.
        tokens.push(Token::Special(String::new()));
        let eos = tokens.len() as u32 - 1;
        Vocab::new(tokens, &[eos])
    }

    fn over(env: TokEnv) -> Result<Vocab, GrammarError> {
        let mut factory = ParserFactory::new_simple(&env).map_err(invalid)?;
        factory.quiet();
        Ok(Vocab {
            factory: Arc::new(factory),
        })
    }

    /// Number of tokens.
    pub fn size(&self) -> usize {
        self.factory.tok_env().tok_trie().vocab_size()
    }

    /// The byte vocabulary constraints are checked against when they are made.
    fn bytes() -> &'static Vocab {
        static BYTES: OnceLock<Vocab> = OnceLock::new();
        BYTES.get_or_init(|| {
            Vocab::over(ApproximateTokEnv::single_byte_env())
                .expect("llguidance builds its own single-byte vocabulary")
        })
    }
}

fn special_word(piece: &[u8]) -> Vec<u8> {
    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
    w.extend_from_slice(piece);
    w
}

fn invalid(e: impl fmt::Display) -> GrammarError {
    GrammarError::Invalid(e.to_string())
}

/// What a generation's text must be, already compiled once (see the crate docs).
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    /// llguidance's grammar in its serialized form (what `TopLevelGrammar` reads).
    grammar: Value,
}

impl Constraint {
    fn checked(grammar: TopLevelGrammar) -> Result<Constraint, GrammarError> {
        Constraint::checked_on(grammar, Vocab::bytes())
    }

    fn checked_on(grammar: TopLevelGrammar, vocab: &Vocab) -> Result<Constraint, GrammarError> {
        let c = Constraint {
            grammar: serde_json::to_value(&grammar).map_err(invalid)?,
        };
        vocab.factory.create_parser(grammar).map_err(invalid)?;
        Ok(c)
    }

    /// A value of a JSON Schema, as much of the standard as llguidance implements; a
    /// keyword it does not is refused by name (`Unimplemented keys: ["…"]`), as is an unknown
    /// `format`. Objects that list properties are closed unless the schema opens them.
    pub fn json_schema(schema: &Value) -> Result<Constraint, GrammarError> {
        Constraint::checked(TopLevelGrammar::from_json_schema(json::compact(schema)?))
    }

    /// One JSON object of any content (JSON mode), with blank runs and numbers of bounded
    /// length, so a model cannot run on in blanks or digits (see `json.rs`).
    pub fn json_object() -> Constraint {
        Constraint::lark(&json::object_lark()).expect("the JSON-mode grammar compiles")
    }

    /// A match of a regex (Rust `regex` syntax) over the whole output.
    pub fn regex(rx: &str) -> Result<Constraint, GrammarError> {
        Constraint::checked(TopLevelGrammar::from_regex(rx))
    }

    /// A sentence of a Lark grammar (llguidance's dialect, with `%json {…}` for schemas).
    pub fn lark(grammar: &str) -> Result<Constraint, GrammarError> {
        if grammar.trim().is_empty() {
            return Err(GrammarError::Invalid("the grammar is empty".into()));
        }
        Constraint::checked(TopLevelGrammar::from_lark(grammar.to_string()))
    }

    /// A sentence of a GBNF grammar (llama.cpp's format), rewritten as Lark (see `gbnf.rs`).
    pub fn gbnf(grammar: &str) -> Result<Constraint, GrammarError> {
        Constraint::lark(&gbnf::to_lark(grammar)?)
    }

    /// `before`, a value of one of `schemas`, then `after`, each exactly: a tool call in its
    /// model's markup, one alternative per tool (each schema keeps its own definitions).
    pub fn framed_json(
        before: &str,
        schemas: &[Value],
        after: &str,
    ) -> Result<Constraint, GrammarError> {
        let alternatives: Vec<Vec<Group>> = schemas
            .iter()
            .map(|s| {
                vec![Group::always(vec![
                    Piece::Text(before.to_string()),
                    Piece::Json(s.clone()),
                    Piece::Text(after.to_string()),
                ])]
            })
            .collect();
        Constraint::one_of(&alternatives)
    }

    /// One of `alternatives`, each a sequence of groups of [`Piece`]s written exactly in
    /// order, an optional group at most once: tool calls whose arguments are tagged
    /// parameters, an optional parameter a group of its own. A grammar that names control
    /// tokens ([`Piece::Special`]) is checked over the bytes and those tokens; a model's
    /// vocabulary without them refuses it when a [`Matcher`] is made.
    pub fn one_of(alternatives: &[Vec<Group>]) -> Result<Constraint, GrammarError> {
        if alternatives.is_empty() {
            return Err(GrammarError::Invalid("no alternative to hold to".into()));
        }
        let names: Vec<String> = (0..alternatives.len()).map(|i| format!("alt{i}")).collect();
        let mut lark = format!("start: {}", names.join(" | "));
        let mut rules = PieceRules::default();
        for (name, groups) in names.iter().zip(alternatives) {
            let mut rule = Vec::new();
            for group in groups {
                let items = group
                    .pieces
                    .iter()
                    .filter_map(|p| rules.item(p).transpose())
                    .collect::<Result<Vec<_>, _>>()?;
                match (items.is_empty(), group.optional) {
                    (true, _) => {}
                    (false, false) => rule.push(items.join(" ")),
                    (false, true) => rule.push(format!("({})?", items.join(" "))),
                }
            }
            if rule.is_empty() {
                return Err(GrammarError::Invalid(
                    "an alternative with nothing to write".into(),
                ));
            }
            lark += &format!("\n{name}: {}", rule.join(" "));
        }
        lark += "\n";
        lark += &rules.values;
        if rules.specials.is_empty() {
            return Constraint::lark(&lark);
        }
        rules.specials.sort();
        rules.specials.dedup();
        let grammar = TopLevelGrammar::from_lark(lark);
        Constraint::checked_on(grammar, &Vocab::bytes_and(rules.specials)?)
    }

    /// Free reasoning, ended by the first `close` (`</think>`) and at most two blanks, then
    /// this constraint: for output that starts inside a reasoning block the prompt opened.
    pub fn after_reasoning(&self, close: &str) -> Result<Constraint, GrammarError> {
        if close.is_empty() {
            return Err(GrammarError::Invalid(
                "an empty reasoning close marker".into(),
            ));
        }
        let mut held = self.top_level()?;
        let Some(first) = held.grammars.first_mut() else {
            return Err(GrammarError::Invalid(
                "a constraint without a grammar".into(),
            ));
        };
        first.name = Some("held".into());
        // The reasoning text is one lazy lexeme: it ends at the first closing marker.
        let start = GrammarWithLexer::from_lark(format!(
            "start: think ws? @held\nthink[lazy]: /(?s:.*){}/\nws: /[ \\t\\r\\n]{{1,2}}/",
            regex_escape(close)
        ));
        held.grammars.insert(0, start);
        Constraint::checked(held)
    }

    /// Whether `text` is a whole text of this constraint (fed byte by byte): the grammar
    /// as the oracle for text written by hand.
    pub fn accepts(&self, text: &[u8]) -> bool {
        self.fed(text).is_some_and(|mut m| m.is_accepting())
    }

    /// Whether `text` begins a whole text of this constraint (output cut by a token limit).
    pub fn admits_prefix(&self, text: &[u8]) -> bool {
        self.fed(text).is_some()
    }

    fn fed(&self, text: &[u8]) -> Option<Matcher> {
        let mut m = Matcher::new(Vocab::bytes(), self).ok()?;
        // The byte vocabulary's first 256 ids are the bytes themselves.
        text.iter()
            .all(|&b| m.accept(u32::from(b)).is_ok())
            .then_some(m)
    }

    fn top_level(&self) -> Result<TopLevelGrammar, GrammarError> {
        serde_json::from_value(self.grammar.clone()).map_err(invalid)
    }
}

/// A part of a text [`Constraint::one_of`] holds to.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// This text, exactly.
    Text(String),
    /// One JSON value of this schema, compact as every schema here is written.
    Json(Value),
    /// One control token, by its piece (`<|channel|>`): never text.
    Special(String),
}

/// Pieces written together: all of them, or (optional) none.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// The pieces, in order.
    pub pieces: Vec<Piece>,
    /// The group may be left out.
    pub optional: bool,
}

impl Group {
    /// Pieces that are always written.
    pub fn always(pieces: Vec<Piece>) -> Group {
        Group {
            pieces,
            optional: false,
        }
    }
}

/// What [`Constraint::one_of`] writes besides its alternatives: one `%json` rule per JSON
/// piece, and the control tokens named.
#[derive(Default)]
struct PieceRules {
    values: String,
    n_values: usize,
    specials: Vec<String>,
}

impl PieceRules {
    /// The Lark item of `piece` (`None` for empty text), its rule written here.
    fn item(&mut self, piece: &Piece) -> Result<Option<String>, GrammarError> {
        Ok(Some(match piece {
            Piece::Text(t) if t.is_empty() => return Ok(None),
            Piece::Text(t) => quote(t),
            // Written raw: llguidance's Lark refuses what it does not lex as a token name.
            Piece::Special(name) => {
                self.specials.push(name.clone());
                name.clone()
            }
            Piece::Json(schema) => {
                let schema = serde_json::to_string(&json::compact(schema)?).map_err(invalid)?;
                let value = format!("value{}", self.n_values);
                self.n_values += 1;
                self.values += &format!("{value}: %json {schema}\n");
                value
            }
        }))
    }
}

/// A Lark string literal of `s`.
fn quote(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
}

/// `s` as a regex that matches it literally, inside a Lark `/…/`: the metacharacters of
/// Rust's `regex` are escaped, and the slash that would end the literal.
fn regex_escape(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~/".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// One generation held to a [`Constraint`]: which tokens may come next, and the tokens
/// taken so far.
pub struct Matcher {
    inner: llguidance::Matcher,
    vocab: usize,
    eog: SimpleVob,
}

impl fmt::Debug for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Matcher")
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Matcher {
    /// `constraint` over `vocab`, at the start of the output.
    pub fn new(vocab: &Vocab, constraint: &Constraint) -> Result<Matcher, GrammarError> {
        let parser = vocab
            .factory
            .create_parser(constraint.top_level()?)
            .map_err(invalid)?;
        let trie = vocab.factory.tok_env().tok_trie();
        Ok(Matcher {
            inner: llguidance::Matcher::new(Ok(parser)),
            vocab: trie.vocab_size(),
            eog: trie.eos_token_set(),
        })
    }

    /// The tokens that may come next (end-of-generation ones only where the text is
    /// whole; only they once the grammar can take nothing more).
    pub fn allowed(&mut self) -> Result<SimpleVob, GrammarError> {
        let mut mask = self.inner.compute_mask_or_eos().map_err(stuck)?;
        if self.inner.is_accepting().map_err(stuck)? {
            mask.or(&self.eog);
        }
        Ok(mask)
    }

    /// Sets every logit of a token that may not come next to `-inf` (and every one past
    /// the vocabulary: a model's row may be padded); returns how many tokens remain.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<usize, GrammarError> {
        Ok(self.next_mask()?.apply(logits))
    }

    /// The mask of the tokens that may come next, to apply to a row later: what
    /// [`Matcher::mask`] applies, computed before the row exists.
    pub fn next_mask(&mut self) -> Result<Mask, GrammarError> {
        Ok(Mask {
            allowed: self.allowed()?,
            vocab: self.vocab,
        })
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool, GrammarError> {
        if token as usize >= self.vocab {
            return Err(GrammarError::UnknownToken(token));
        }
        if self.eog.is_allowed(token) {
            return self.inner.is_accepting().map_err(stuck);
        }
        Ok(self.inner.validate_tokens(&[token]).map_err(stuck)? == 1)
    }

    /// Takes `token` as the next one; a token the grammar refuses is an error (and leaves
    /// the matcher unusable). An end-of-generation token is taken only where the text is
    /// whole, and changes nothing.
    pub fn accept(&mut self, token: u32) -> Result<(), GrammarError> {
        if !self.allows(token)? {
            return Err(GrammarError::Stuck(format!(
                "token {token} cannot come next"
            )));
        }
        if self.eog.is_allowed(token) {
            return Ok(());
        }
        self.inner.consume_token(token).map_err(stuck)
    }

    /// Whether the text so far is whole.
    pub fn is_accepting(&mut self) -> bool {
        self.inner.is_accepting().unwrap_or(false)
    }

    /// Back to the start of the output.
    pub fn reset(&mut self) -> Result<(), GrammarError> {
        self.inner.reset().map_err(stuck)
    }
}

/// The tokens that may come next at one position of a [`Matcher`]'s output.
#[derive(Clone)]
pub struct Mask {
    allowed: SimpleVob,
    vocab: usize,
}

impl fmt::Debug for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mask")
            .field("allowed", &self.allowed.num_set())
            .field("vocab", &self.vocab)
            .finish()
    }
}

impl Mask {
    /// Sets every logit of a token that may not come next to `-inf` (and every one past
    /// the vocabulary: a model's row may be padded); returns how many tokens remain.
    pub fn apply(&self, logits: &mut [f32]) -> usize {
        let mut left = 0;
        for (id, l) in logits.iter_mut().enumerate() {
            if id < self.vocab && self.allowed.is_allowed(id as u32) {
                left += 1;
            } else {
                *l = f32::NEG_INFINITY;
            }
        }
        left
    }
}

fn stuck(e: impl fmt::Display) -> GrammarError {
    GrammarError::Stuck(e.to_string())
}

#[cfg(test)]
mod tests;
