//! The lexical pieces of JSON text (RFC 8259) that the byte grammar of
//! [`crate::json_schema_prefix`] is built from: numbers and strings a byte at a time, and the
//! two bounds that keep constrained decoding from running away.
//!
//! Never decides anything about structure, schemas or tokens.

/// Deepest nesting of objects and arrays accepted.
pub const MAX_DEPTH: usize = 32;

/// Longest run of whitespace accepted between two tokens of the JSON text (a model held to
/// JSON can otherwise emit newlines until its token limit).
pub const MAX_WHITESPACE: u8 = 32;

/// Largest power of ten a number may reach: a number is taken only while its magnitude is
/// sure to stay below `10^MAX_MAGNITUDE` (f64's largest finite value is about 1.8 · 10^308).
/// JSON's syntax has no bound, but parsers such as serde_json refuse a number that
/// overflows f64, so the grammar never lets one be written.
const MAX_MAGNITUDE: u32 = 308;

/// Where a number is: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Minus,
    Zero,
    Int,
    Point,
    Frac,
    Exp,
    ExpSign,
    ExpDigits,
}

/// A number being written, with what bounds its magnitude: below `10^(int_digits + exp)`,
/// where a negative exponent counts as 0 (the fraction never adds a power of ten).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Num {
    phase: Phase,
    /// Digits of the integer part (0 for a leading `0`).
    int_digits: u16,
    /// The exponent's value so far (saturating), and whether it is negative.
    exp: u16,
    exp_negative: bool,
}

impl Num {
    /// The state after a number's first byte, if `b` can begin one.
    pub(crate) fn start(b: u8) -> Option<Num> {
        let (phase, int_digits) = match b {
            b'-' => (Phase::Minus, 0),
            b'0' => (Phase::Zero, 0),
            b'1'..=b'9' => (Phase::Int, 1),
            _ => return None,
        };
        Some(Num {
            phase,
            int_digits,
            exp: 0,
            exp_negative: false,
        })
    }

    /// The state after `b`, if `b` extends the number (`integer`: no fraction or exponent)
    /// and keeps its magnitude in bounds.
    pub(crate) fn next(self, b: u8, integer: bool) -> Option<Num> {
        let phase = match (self.phase, b) {
            (Phase::Minus, b'0') => Phase::Zero,
            (Phase::Minus | Phase::Int, b'0'..=b'9') => Phase::Int,
            _ if integer => return None,
            (Phase::Zero | Phase::Int, b'.') => Phase::Point,
            (Phase::Point | Phase::Frac, b'0'..=b'9') => Phase::Frac,
            (Phase::Zero | Phase::Int | Phase::Frac, b'e' | b'E') => Phase::Exp,
            (Phase::Exp, b'+' | b'-') => Phase::ExpSign,
            (Phase::Exp | Phase::ExpSign | Phase::ExpDigits, b'0'..=b'9') => Phase::ExpDigits,
            _ => return None,
        };
        let mut n = Num { phase, ..self };
        match phase {
            Phase::Int => n.int_digits = n.int_digits.saturating_add(1),
            Phase::ExpSign => n.exp_negative = b == b'-',
            Phase::ExpDigits => {
                n.exp = n.exp.saturating_mul(10).saturating_add(u16::from(b - b'0'));
            }
            _ => {}
        }
        let exp = if n.exp_negative { 0 } else { u32::from(n.exp) };
        (u32::from(n.int_digits) + exp <= MAX_MAGNITUDE).then_some(n)
    }

    /// Whether the number may end here.
    pub(crate) fn complete(self) -> bool {
        matches!(
            self.phase,
            Phase::Zero | Phase::Int | Phase::Frac | Phase::ExpDigits
        )
    }
}

/// Where a string's next byte lands: in plain text, or partway through an escape sequence.
///
/// `\uXXXX` escapes of UTF-16 surrogates must come in pairs, a high one (`D800`–`DBFF`)
/// followed at once by a low one (`DC00`–`DFFF`): RFC 8259's syntax allows a lone surrogate,
/// but it encodes no character, and parsers such as serde_json refuse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Esc {
    /// Plain text.
    Text,
    /// After a backslash.
    Backslash,
    /// After `\u`.
    U,
    /// After `\ud`: a high or low surrogate, or neither.
    UD,
    /// `n` hex digits of a code unit that is not a surrogate still to come.
    Hex(u8),
    /// `n` hex digits of a high surrogate still to come.
    High(u8),
    /// After a high surrogate: its low one's backslash, `u`, `d`, then a digit `c`–`f`.
    Low(u8),
}

/// The state after byte `b` of a string in state `esc`: `Some(None)` when `b` closes the
/// string, `Some(Some(esc))` when the string goes on, `None` when `b` cannot be there.
pub(crate) fn string_byte(esc: Esc, b: u8) -> Option<Option<Esc>> {
    let hex = b.is_ascii_hexdigit();
    Some(Some(match (esc, b) {
        (Esc::Text, b'"') => return Some(None),
        (Esc::Text, b'\\') => Esc::Backslash,
        // Control characters must be escaped; every other byte (UTF-8 included) is text.
        (Esc::Text, 0..0x20) => return None,
        (Esc::Text, _) => Esc::Text,
        (Esc::Backslash, b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Esc::Text,
        (Esc::Backslash, b'u') => Esc::U,
        (Esc::U, b'd' | b'D') => Esc::UD,
        (Esc::U, _) if hex => Esc::Hex(3),
        (Esc::UD, b'0'..=b'7') => Esc::Hex(2),
        (Esc::UD, b'8' | b'9' | b'a' | b'b' | b'A' | b'B') => Esc::High(2),
        (Esc::Hex(1), _) if hex => Esc::Text,
        (Esc::Hex(n), _) if hex => Esc::Hex(n - 1),
        (Esc::High(1), _) if hex => Esc::Low(0),
        (Esc::High(n), _) if hex => Esc::High(n - 1),
        (Esc::Low(0), b'\\') => Esc::Low(1),
        (Esc::Low(1), b'u') => Esc::Low(2),
        (Esc::Low(2), b'd' | b'D') => Esc::Low(3),
        (Esc::Low(3), b'c'..=b'f' | b'C'..=b'F') => Esc::Hex(2),
        _ => return None,
    }))
}
