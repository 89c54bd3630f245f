//! Whether bytes are a prefix of one JSON object (RFC 8259), fed a byte at a time: the
//! grammar behind JSON mode ([`crate::json_mode`]).
//!
//! The state is a small `Copy` value, so trying a token's bytes is a copy and a loop, with
//! no allocation. Two bounds keep constrained decoding from running away, and are part of
//! the grammar: objects and arrays nest at most [`MAX_DEPTH`] deep, and whitespace between
//! tokens runs at most [`MAX_WHITESPACE`] bytes (a model held to JSON can otherwise emit
//! newlines until its token limit). Nothing may follow the closing brace.
//!
//! Never decides anything about tokens or sampling: it sees bytes only.

/// Deepest nesting of objects and arrays accepted.
pub const MAX_DEPTH: usize = 32;

/// Longest run of whitespace accepted between two tokens of the JSON text.
pub const MAX_WHITESPACE: u8 = 32;

/// Where in the text the next byte lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the top-level object.
    Start,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After `:` or `,` in an array: a value.
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After a value inside a container: `,` or the container's closing bracket.
    AfterValue,
    /// Inside a string (a key when `key`), after `escape` bytes of an escape sequence
    /// (0: none; 1: the backslash; 2..=5: `\u` and that many hex digits less 2).
    Str { key: bool, escape: u8 },
    /// Inside a number.
    Num(Num),
    /// Inside `true`, `false` or `null`: `rest` bytes of `word` still to come.
    Literal { word: Word, rest: u8 },
    /// The top-level object is closed.
    Done,
}

/// States of a number: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Num {
    Minus,
    Zero,
    Int,
    Point,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

impl Num {
    /// The state after a number's first byte, if `b` can begin one.
    pub(crate) fn start(b: u8) -> Option<Num> {
        match b {
            b'-' => Some(Num::Minus),
            b'0' => Some(Num::Zero),
            b'1'..=b'9' => Some(Num::Int),
            _ => None,
        }
    }

    /// The state after `b`, if `b` extends the number (`integer`: no fraction or exponent).
    pub(crate) fn next(self, b: u8, integer: bool) -> Option<Num> {
        Some(match (self, b) {
            (Num::Minus, b'0') => Num::Zero,
            (Num::Minus, b'1'..=b'9') => Num::Int,
            (Num::Int, b'0'..=b'9') => Num::Int,
            _ if integer => return None,
            (Num::Zero | Num::Int, b'.') => Num::Point,
            (Num::Point | Num::Frac, b'0'..=b'9') => Num::Frac,
            (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::Exp,
            (Num::Exp, b'+' | b'-') => Num::ExpSign,
            (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => Num::ExpDigits,
            _ => return None,
        })
    }

    /// Whether the number may end here.
    pub(crate) fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

/// A byte inside a string after `escape` bytes of an escape sequence (0: none; 1: the
/// backslash; 2..=5: `\u` and that many hex digits less 2): `Some(None)` when it closes the
/// string, `Some(Some(escape))` when the string goes on, `None` when it cannot be there.
pub(crate) fn string_byte(escape: u8, b: u8) -> Option<Option<u8>> {
    Some(Some(match (escape, b) {
        (0, b'"') => return Some(None),
        (0, b'\\') => 1,
        // Control characters must be escaped; every other byte (UTF-8 included) is text.
        (0, 0..0x20) => return None,
        (0, _) => 0,
        (1, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => 0,
        (1, b'u') => 2,
        (2..=4, b) if b.is_ascii_hexdigit() => escape + 1,
        (5, b) if b.is_ascii_hexdigit() => 0,
        _ => return None,
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Word {
    True,
    False,
    Null,
}

impl Word {
    fn bytes(self) -> &'static [u8] {
        match self {
            Word::True => b"true",
            Word::False => b"false",
            Word::Null => b"null",
        }
    }
}

/// A prefix of one JSON object, as far as it has been fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonPrefix {
    at: At,
    /// Open containers, innermost last: `true` for an object, `false` for an array.
    open: [bool; MAX_DEPTH],
    depth: u8,
    whitespace: u8,
}

impl Default for JsonPrefix {
    fn default() -> Self {
        JsonPrefix::new()
    }
}

impl JsonPrefix {
    /// The empty prefix.
    pub fn new() -> JsonPrefix {
        JsonPrefix {
            at: At::Start,
            open: [false; MAX_DEPTH],
            depth: 0,
            whitespace: 0,
        }
    }

    /// Whether the text is one whole JSON object.
    pub fn is_complete(&self) -> bool {
        self.at == At::Done
    }

    /// This prefix extended by `bytes`, or `None` when no JSON object starts with the result.
    pub fn feed(mut self, bytes: &[u8]) -> Option<JsonPrefix> {
        for &b in bytes {
            self.push(b)?;
        }
        Some(self)
    }

    /// Feeds one byte; `None` when it cannot continue the prefix.
    fn push(&mut self, b: u8) -> Option<()> {
        let structural = !matches!(self.at, At::Str { .. } | At::Num(_) | At::Literal { .. });
        if structural && matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            if self.at == At::Done || self.whitespace >= MAX_WHITESPACE {
                return None;
            }
            self.whitespace += 1;
            return Some(());
        }
        self.whitespace = 0;
        match self.at {
            At::Start if b == b'{' => self.open_container(true),
            At::KeyOrClose if b == b'}' => self.close(true),
            At::KeyOrClose | At::Key if b == b'"' => {
                self.at = At::Str {
                    key: true,
                    escape: 0,
                };
                Some(())
            }
            At::Colon if b == b':' => {
                self.at = At::Value;
                Some(())
            }
            At::ValueOrClose if b == b']' => self.close(false),
            At::Value | At::ValueOrClose => self.start_value(b),
            At::AfterValue => match b {
                b',' => {
                    self.at = if self.innermost_is_object() {
                        At::Key
                    } else {
                        At::Value
                    };
                    Some(())
                }
                b'}' => self.close(true),
                b']' => self.close(false),
                _ => None,
            },
            At::Str { key, escape } => self.string_byte(key, escape, b),
            At::Num(n) => self.number_byte(n, b),
            At::Literal { word, rest } => {
                let bytes = word.bytes();
                (bytes[bytes.len() - rest as usize] == b).then_some(())?;
                if rest == 1 {
                    self.end_value();
                } else {
                    self.at = At::Literal {
                        word,
                        rest: rest - 1,
                    };
                }
                Some(())
            }
            At::Start | At::KeyOrClose | At::Key | At::Colon | At::Done => None,
        }
    }

    fn innermost_is_object(&self) -> bool {
        self.depth > 0 && self.open[self.depth as usize - 1]
    }

    /// Opens an object or an array; `None` past [`MAX_DEPTH`].
    fn open_container(&mut self, object: bool) -> Option<()> {
        let d = self.depth as usize;
        (d < MAX_DEPTH).then_some(())?;
        self.open[d] = object;
        self.depth += 1;
        self.at = if object {
            At::KeyOrClose
        } else {
            At::ValueOrClose
        };
        Some(())
    }

    /// Closes the innermost container, which must be an object (`object`) or an array.
    fn close(&mut self, object: bool) -> Option<()> {
        (self.depth > 0 && self.innermost_is_object() == object).then_some(())?;
        self.depth -= 1;
        self.end_value();
        Some(())
    }

    /// A value just ended: the text is complete at depth 0.
    fn end_value(&mut self) {
        self.at = if self.depth == 0 {
            At::Done
        } else {
            At::AfterValue
        };
    }

    fn start_value(&mut self, b: u8) -> Option<()> {
        self.at = match b {
            b'{' => return self.open_container(true),
            b'[' => return self.open_container(false),
            b'"' => At::Str {
                key: false,
                escape: 0,
            },
            b'-' | b'0'..=b'9' => At::Num(Num::start(b)?),
            b't' => At::Literal {
                word: Word::True,
                rest: 3,
            },
            b'f' => At::Literal {
                word: Word::False,
                rest: 4,
            },
            b'n' => At::Literal {
                word: Word::Null,
                rest: 3,
            },
            _ => return None,
        };
        Some(())
    }

    fn string_byte(&mut self, key: bool, escape: u8, b: u8) -> Option<()> {
        match string_byte(escape, b)? {
            Some(escape) => self.at = At::Str { key, escape },
            None if key => self.at = At::Colon,
            None => self.end_value(),
        }
        Some(())
    }

    /// A byte inside a number; a byte that cannot extend a complete number ends it and is
    /// read again as what follows the value.
    fn number_byte(&mut self, n: Num, b: u8) -> Option<()> {
        match n.next(b, false) {
            Some(next) => {
                self.at = At::Num(next);
                Some(())
            }
            None if n.complete() => {
                self.end_value();
                self.push(b)
            }
            None => None,
        }
    }
}

#[cfg(test)]
mod tests;
