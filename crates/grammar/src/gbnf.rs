//! GBNF (llama.cpp's grammar format) rewritten as llguidance Lark, token by token:
//! `name ::= body` rules become `name: body` (`root` is `start`), character classes and `.`
//! become regex terminals, strings, groups, alternatives and the `* + ? {m,n}` repeats keep
//! their meaning (llguidance's Lark reads them alike), `#` comments go.
//!
//! Never guesses: a GBNF it cannot read is an error naming the place, not a looser grammar.

use crate::GrammarError;

/// The Lark text of the GBNF grammar `src`.
pub(crate) fn to_lark(src: &str) -> Result<String, GrammarError> {
    let tokens = tokenize(src)?;
    let mut out = String::new();
    let mut i = 0;
    while i < tokens.len() {
        match (&tokens[i], tokens.get(i + 1)) {
            (Tok::Name(n), Some(Tok::Defines)) => {
                if !out.is_empty() {
                    out.push('\n');
                }
                out += &rule_name(n);
                out += ":";
                i += 2;
            }
            (_, _) if out.is_empty() => {
                return Err(bad("a GBNF grammar starts with a rule ('name ::= …')"));
            }
            (Tok::Defines, _) => return Err(bad("'::=' without a rule name")),
            (Tok::Name(n), _) => {
                out.push(' ');
                out += &rule_name(n);
                i += 1;
            }
            (Tok::Text(t), _) => {
                out.push(' ');
                out += t;
                i += 1;
            }
        }
    }
    if !out.lines().any(|l| l.starts_with("start:")) {
        return Err(bad("a GBNF grammar needs a 'root' rule"));
    }
    Ok(out)
}

#[derive(Debug, PartialEq)]
enum Tok {
    Name(String),
    Defines,
    /// Lark text standing for one GBNF token.
    Text(String),
}

fn bad(what: &str) -> GrammarError {
    GrammarError::Invalid(format!("GBNF: {what}"))
}

/// GBNF names may hold `-` and capitals; Lark rules are lower-case identifiers, so every
/// name gets a prefix no Lark keyword or terminal has.
fn rule_name(n: &str) -> String {
    if n == "root" {
        return "start".into();
    }
    format!("g_{}", n.replace('-', "_").to_lowercase())
}

fn tokenize(src: &str) -> Result<Vec<Tok>, GrammarError> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match c {
            b' ' | b'\t' | b'\r' | b'\n' => i += 1,
            b'#' => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b':' if src[i..].starts_with("::=") => {
                out.push(Tok::Defines);
                i += 3;
            }
            b'"' | b'[' => {
                let close = if c == b'"' { b'"' } else { b']' };
                let start = i;
                i += 1;
                while i < b.len() && b[i] != close {
                    i += if b[i] == b'\\' { 2 } else { 1 };
                }
                if i >= b.len() {
                    return Err(bad(&format!("unclosed {} at byte {start}", c as char)));
                }
                i += 1;
                let lit = &src[start..i];
                out.push(Tok::Text(if c == b'"' {
                    lit.to_string()
                } else {
                    format!("/{}/", lit.replace('/', "\\/"))
                }));
            }
            b'.' => {
                out.push(Tok::Text("/(?s:.)/".into()));
                i += 1;
            }
            b'(' | b')' | b'|' | b'*' | b'+' | b'?' => {
                out.push(Tok::Text((c as char).to_string()));
                i += 1;
            }
            b'{' => {
                let end = src[i..]
                    .find('}')
                    .ok_or_else(|| bad(&format!("unclosed '{{' at byte {i}")))?;
                let rep = &src[i..=i + end];
                if !rep[1..rep.len() - 1]
                    .bytes()
                    .all(|x| x.is_ascii_digit() || x == b',' || x == b' ')
                {
                    return Err(bad(&format!("bad repeat {rep}")));
                }
                out.push(Tok::Text(rep.replace(' ', "")));
                i += end + 1;
            }
            _ if c.is_ascii_alphanumeric() || c == b'_' || c == b'-' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'-')
                {
                    i += 1;
                }
                out.push(Tok::Name(src[start..i].to_string()));
            }
            _ => {
                return Err(bad(&format!(
                    "unexpected {:?} at byte {i}",
                    src[i..].chars().next().unwrap_or(' ')
                )));
            }
        }
    }
    Ok(out)
}
