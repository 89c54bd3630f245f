//! Whether bytes are a prefix of a JSON text that a [`JsonSchema`] generates, fed a byte at
//! a time: the grammar behind `json_schema` output ([`crate::json_mode`]).
//!
//! The text is one JSON object (RFC 8259) with nothing after its closing brace, objects and
//! arrays nested at most [`MAX_DEPTH`] deep and whitespace between tokens in runs of at
//! most [`MAX_WHITESPACE`] bytes, further held to the schema: each value of the node its
//! position calls for, properties in the schema's order with every required one present,
//! array lengths within bounds, `enum` and `const` values as their compact text. The state
//! is a small `Copy` value, so trying a token's bytes is a copy and a loop, with no
//! allocation; the schema is passed in, never stored.
//!
//! Never decides anything about tokens or sampling: it sees bytes only.

use crate::json_lex::{Esc, MAX_DEPTH, MAX_WHITESPACE, Num, string_byte};
use crate::json_schema::{JsonSchema, Node, NodeId};

/// An open object (`next`: its next property's index; `prop`: the property whose value is
/// being written) or array (`next`: the items so far).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Frame {
    node: NodeId,
    array: bool,
    next: u16,
    prop: u16,
}

/// Where in the text the next byte lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum At {
    /// Before the root object.
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
    /// Inside a key's text, `pos` bytes in; `cands` has a bit for each property it may
    /// still be.
    KeyText { cands: u64, pos: u16 },
    /// Inside a string (a map's key when `key`).
    Str { key: bool, escape: Esc },
    /// Inside a number.
    Num { num: Num, integer: bool },
    /// Inside a literal of `node`, `pos` bytes in, which may still be any of its texts
    /// `lo..hi`.
    Lit {
        node: NodeId,
        lo: u16,
        hi: u16,
        pos: u16,
    },
    /// The root object is closed.
    Done,
}

/// A prefix of a text the schema generates, as far as it has been fed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaPrefix {
    at: At,
    frames: [Frame; MAX_DEPTH],
    depth: u8,
    whitespace: u8,
}

impl Default for SchemaPrefix {
    fn default() -> Self {
        SchemaPrefix::new()
    }
}

impl SchemaPrefix {
    /// The empty prefix.
    pub fn new() -> SchemaPrefix {
        SchemaPrefix {
            at: At::Start,
            frames: [Frame {
                node: 0,
                array: false,
                next: 0,
                prop: 0,
            }; MAX_DEPTH],
            depth: 0,
            whitespace: 0,
        }
    }

    /// Whether the text is one whole value of the schema.
    pub fn is_complete(&self) -> bool {
        self.at == At::Done
    }

    /// Whether the next byte lands in a string's text (not inside an escape sequence), where
    /// any byte but a quote, a backslash or a control byte leaves the state as it is.
    pub fn in_string_text(&self) -> bool {
        matches!(
            self.at,
            At::Str {
                escape: Esc::Text,
                ..
            }
        )
    }

    /// This prefix extended by `bytes`, or `None` when no text of `schema` starts with the
    /// result. `schema` must be the one every earlier byte was fed with.
    pub fn feed(mut self, schema: &JsonSchema, bytes: &[u8]) -> Option<SchemaPrefix> {
        for &b in bytes {
            self.push(schema, b)?;
        }
        Some(self)
    }

    /// Like [`SchemaPrefix::feed`], but stops where the text becomes complete: the prefix
    /// and how many of `bytes` it took (the rest may be whatever follows the JSON text).
    pub fn feed_to_end(
        mut self,
        schema: &JsonSchema,
        bytes: &[u8],
    ) -> Option<(SchemaPrefix, usize)> {
        for (i, &b) in bytes.iter().enumerate() {
            if self.is_complete() {
                return Some((self, i));
            }
            self.push(schema, b)?;
        }
        Some((self, bytes.len()))
    }

    fn push(&mut self, s: &JsonSchema, b: u8) -> Option<()> {
        let structural = !matches!(
            self.at,
            At::Str { .. } | At::Num { .. } | At::Lit { .. } | At::KeyText { .. }
        );
        if structural && matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            if self.at == At::Done || self.whitespace >= MAX_WHITESPACE {
                return None;
            }
            self.whitespace += 1;
            return Some(());
        }
        self.whitespace = 0;
        match self.at {
            At::Start => self.start_value(s, 0, b),
            At::KeyOrClose | At::Key if b == b'"' && self.in_map(s) => {
                self.at = At::Str {
                    key: true,
                    escape: Esc::Text,
                };
                Some(())
            }
            At::KeyOrClose | At::Key if b == b'"' => {
                let cands = self.candidates(s)?;
                (cands != 0).then_some(())?;
                self.at = At::KeyText { cands, pos: 1 };
                Some(())
            }
            At::KeyOrClose if b == b'}' => self.close(s, true),
            At::Colon if b == b':' => {
                self.at = At::Value;
                Some(())
            }
            At::ValueOrClose if b == b']' => self.close(s, false),
            At::Value | At::ValueOrClose => {
                let node = self.value_node(s)?;
                self.start_value(s, node, b)
            }
            At::AfterValue => match b {
                b',' => {
                    self.at = match s.node(self.top()?.node) {
                        Node::Object { .. } | Node::Tagged { .. } => {
                            (self.candidates(s)? != 0).then_some(())?;
                            At::Key
                        }
                        Node::Map { .. } => At::Key,
                        _ => {
                            self.value_node(s)?;
                            At::Value
                        }
                    };
                    Some(())
                }
                b'}' => self.close(s, true),
                b']' => self.close(s, false),
                _ => None,
            },
            At::KeyText { cands, pos } => self.key_byte(s, cands, pos, b),
            At::Str { key, escape } => {
                match string_byte(escape, b)? {
                    Some(escape) => self.at = At::Str { key, escape },
                    None if key => self.at = At::Colon,
                    None => self.end_value(),
                }
                Some(())
            }
            At::Num { num, integer } => match num.next(b, integer) {
                Some(num) => {
                    self.at = At::Num { num, integer };
                    Some(())
                }
                None if num.complete() => {
                    self.end_value();
                    self.push(s, b)
                }
                None => None,
            },
            At::Lit { node, lo, hi, pos } => self.literal_byte(s, node, (lo, hi, pos), b),
            At::KeyOrClose | At::Key | At::Colon | At::Done => None,
        }
    }

    fn top(&self) -> Option<Frame> {
        (self.depth > 0).then(|| self.frames[self.depth as usize - 1])
    }

    fn top_mut(&mut self) -> &mut Frame {
        &mut self.frames[self.depth as usize - 1]
    }

    /// Whether the innermost container is an object of free keys.
    fn in_map(&self, s: &JsonSchema) -> bool {
        self.top()
            .is_some_and(|f| matches!(s.node(f.node), Node::Map { .. }))
    }

    /// The properties the innermost object's next key may be: from its next one up to and
    /// including the first required one (none may be skipped).
    fn candidates(&self, s: &JsonSchema) -> Option<u64> {
        let f = self.top()?;
        let (props, required) = s.properties(f.node)?;
        let from = u64::MAX.checked_shl(u32::from(f.next)).unwrap_or(0);
        let to = match (required & from).trailing_zeros() {
            64 => props.len(),
            r => r as usize + 1,
        };
        let upto = u64::MAX.checked_shr(64 - to as u32).unwrap_or(0);
        Some(from & upto)
    }

    /// The node of the value about to start in the innermost container; `None` when an
    /// array holds as many items as it may.
    fn value_node(&self, s: &JsonSchema) -> Option<NodeId> {
        let f = self.top()?;
        match s.node(f.node) {
            Node::Object { props, .. } | Node::Tagged { head: props, .. } => {
                Some(props[f.prop as usize].1)
            }
            Node::Map { values } => Some(*values),
            Node::Array { items, max, .. } => max.is_none_or(|m| f.next < m).then_some(*items),
            _ => None,
        }
    }

    fn start_value(&mut self, s: &JsonSchema, node: NodeId, b: u8) -> Option<()> {
        match s.node(node) {
            Node::Object { .. } | Node::Tagged { .. } | Node::Map { .. } | Node::Array { .. } => {
                let object = !matches!(s.node(node), Node::Array { .. });
                (b == if object { b'{' } else { b'[' }).then_some(())?;
                let d = self.depth as usize;
                (d < MAX_DEPTH).then_some(())?;
                self.frames[d] = Frame {
                    node,
                    array: !object,
                    next: 0,
                    prop: 0,
                };
                self.depth += 1;
                self.at = if object {
                    At::KeyOrClose
                } else {
                    At::ValueOrClose
                };
            }
            Node::String => {
                (b == b'"').then_some(())?;
                self.at = At::Str {
                    key: false,
                    escape: Esc::Text,
                };
            }
            Node::Number { integer } => {
                self.at = At::Num {
                    num: Num::start(b)?,
                    integer: *integer,
                };
            }
            Node::Literals(texts) => {
                let all = (0, texts.len() as u16, 0);
                return self.literal_byte(s, node, all, b);
            }
            Node::Union(alts) => {
                let alt = *alts.iter().find(|&&a| s.can_begin(a, b))?;
                return self.start_value(s, alt, b);
            }
        }
        Some(())
    }

    /// Byte `b` of a literal whose texts `lo..hi` match its first `pos` bytes. A byte that
    /// extends none of them ends the literal when one is complete, and is read again.
    fn literal_byte(
        &mut self,
        s: &JsonSchema,
        node: NodeId,
        at: (u16, u16, u16),
        b: u8,
    ) -> Option<()> {
        let Node::Literals(texts) = s.node(node) else {
            return None;
        };
        let (lo, hi, pos) = (at.0 as usize, at.1 as usize, at.2 as usize);
        // Texts `lo..hi` share their first `pos` bytes and are sorted: one that ends there
        // comes first, the others follow in the order of their byte at `pos`.
        let start = lo + usize::from(texts[lo].len() == pos);
        let rest = &texts[start..hi];
        let first = start + rest.partition_point(|t| t[pos] < b);
        let end = start + rest.partition_point(|t| t[pos] <= b);
        if first == end {
            return if start > lo {
                self.literal_done(s, node, lo);
                self.push(s, b)
            } else {
                None
            };
        }
        if end - first == 1 && texts[first].len() == pos + 1 {
            self.literal_done(s, node, first);
        } else {
            self.at = At::Lit {
                node,
                lo: first as u16,
                hi: end as u16,
                pos: pos as u16 + 1,
            };
        }
        Some(())
    }

    /// Text `i` of literal `node` was written whole. When it is the tag of a tagged
    /// union's object, that object is the one being written from here on, its first
    /// property (the tag) done.
    fn literal_done(&mut self, s: &JsonSchema, node: NodeId, i: usize) {
        if let Some(f) = self.top()
            && let Node::Tagged { head, objects } = s.node(f.node)
            && head[0].1 == node
        {
            let f = self.top_mut();
            f.node = objects[i];
            f.prop = 0;
            f.next = 1;
        }
        self.end_value();
    }

    fn key_byte(&mut self, s: &JsonSchema, cands: u64, pos: u16, b: u8) -> Option<()> {
        let (props, _) = s.properties(self.top()?.node)?;
        let pos = pos as usize;
        let mut left = 0u64;
        let mut done = None;
        for (i, (key, _)) in props.iter().enumerate() {
            if cands >> i & 1 == 1 && key.get(pos) == Some(&b) {
                left |= 1 << i;
                // A key's text ends at its only unescaped quote, so no other key's text
                // goes on from a whole one.
                if key.len() == pos + 1 {
                    done = Some(i);
                }
            }
        }
        (left != 0).then_some(())?;
        match done {
            Some(i) => {
                let f = self.top_mut();
                f.prop = i as u16;
                f.next = i as u16 + 1;
                self.at = At::Colon;
            }
            None => {
                self.at = At::KeyText {
                    cands: left,
                    pos: pos as u16 + 1,
                }
            }
        }
        Some(())
    }

    /// Closes the innermost container, which must be an object (`object`) with no required
    /// property left, or an array with enough items.
    fn close(&mut self, s: &JsonSchema, object: bool) -> Option<()> {
        let f = self.top()?;
        let ok = match s.node(f.node) {
            Node::Object { required, .. } => {
                object && required.checked_shr(u32::from(f.next)).unwrap_or(0) == 0
            }
            Node::Map { .. } => object,
            Node::Array { min, .. } => !object && f.next >= *min,
            _ => false,
        };
        ok.then_some(())?;
        self.depth -= 1;
        self.end_value();
        Some(())
    }

    /// A value just ended: the text is complete at depth 0; an array counts an item.
    fn end_value(&mut self) {
        if self.depth == 0 {
            self.at = At::Done;
            return;
        }
        self.at = At::AfterValue;
        let f = self.top_mut();
        // An object's `next` was set when its key closed; arrays count their items here.
        if f.array {
            f.next = f.next.saturating_add(1);
        }
    }
}

#[cfg(test)]
mod any_value_tests;
#[cfg(test)]
mod tests;
