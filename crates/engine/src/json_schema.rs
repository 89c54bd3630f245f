//! JSON schemas compiled for constrained decoding (OpenAI's `response_format` `json_schema`):
//! a subset of JSON Schema that can be enforced byte by byte, turned into the node tree
//! that [`crate::json_schema_prefix`] walks.
//!
//! What is generated is a subset of what the schema accepts, chosen so that a byte grammar
//! can hold the output to it: properties in the schema's order, optional ones possibly
//! skipped, no properties the schema does not list; numbers and strings in any valid form;
//! `enum` and `const` values in their compact JSON text. So every complete output is valid
//! against the schema. Alternatives must begin with different bytes, except objects that
//! all begin with one required property whose value is a different literal in each (a
//! discriminated union, as pydantic writes one): the tag decides. A schema that does not
//! constrain a value (`{}`, `true`, an object schema without `properties`, an array schema
//! without `items`) takes any JSON there, so one object of any content (JSON mode) is the
//! schema `{"type": "object"}` ([`JsonSchema::any_object`]).
//!
//! Keywords that would constrain output in ways the grammar cannot enforce (`pattern`,
//! `minimum`, `minLength`, recursive `$ref`, ...) are refused with an error naming them,
//! never ignored: a schema is either enforced whole or refused. Annotations (`title`,
//! `description`, ...) are ignored.

use serde_json::{Map, Value};

use crate::json_lex::MAX_DEPTH;

/// Most properties one object schema may list (the grammar tracks them in a 64-bit set).
pub const MAX_PROPERTIES: usize = 64;

/// Most nodes a compiled schema may have (inlined `$ref`s count each time).
pub const MAX_NODES: usize = 4096;

/// Most values an `enum` may list.
pub const MAX_ENUM: usize = 1024;

/// Most bytes of `enum` and `const` texts a compiled schema may hold in all. Inlined `$ref`s
/// count each time, so a small request cannot compile into a huge schema.
pub const MAX_LITERAL_BYTES: usize = 1 << 20;

/// Index of a node in [`JsonSchema::nodes`].
pub(crate) type NodeId = u16;

/// An object's property: its key's JSON text (quotes included) and its value's node.
pub(crate) type Property = (Vec<u8>, NodeId);

/// One value position of the schema.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Node {
    /// An object with these properties, in order: each key's JSON text (quotes included) and
    /// its value's node; `required` has bit `i` set when property `i` must appear.
    Object { props: Vec<Property>, required: u64 },
    /// Objects told apart by their first property, a different literal in each (a
    /// discriminated union): `head` is that property alone (its key, and the node of every
    /// object's tag text, sorted), and `objects[i]` the object whose tag is text `i`. Once a
    /// tag is written, the text goes on as its object, that first property done.
    Tagged {
        head: Vec<Property>,
        objects: Vec<NodeId>,
    },
    /// An object whose keys are any strings (repeats included, as JSON's syntax allows), each
    /// with a value of `values`.
    Map { values: NodeId },
    /// An array of `items`, with at least `min` and at most `max` (`None`: any number).
    Array {
        items: NodeId,
        min: u16,
        max: Option<u16>,
    },
    /// Any string.
    String,
    /// Any number, or only integers (`-? (0 | [1-9][0-9]*)`).
    Number { integer: bool },
    /// One of these JSON texts, sorted and distinct (`enum`, `const`, booleans, null).
    Literals(Vec<Vec<u8>>),
    /// One of these nodes, which begin with different bytes (so the first byte chooses).
    Union(Vec<NodeId>),
}

/// A compiled schema; the root (node 0) is an object, a tagged union of objects or a map.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchema {
    pub(crate) nodes: Vec<Node>,
    /// Each node's first bytes: bit `b` of the set when `b` can begin a value of it.
    first: Vec<[u64; 4]>,
}

/// Why a schema cannot be enforced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SchemaError(String);

fn err<T>(msg: impl Into<String>) -> Result<T, SchemaError> {
    Err(SchemaError(msg.into()))
}

/// Keywords that only describe and never constrain.
const ANNOTATIONS: [&str; 13] = [
    "title",
    "description",
    "default",
    "examples",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$defs",
    "definitions",
    // OpenAPI's hint beside `oneOf`; the alternatives' own `const` tags already decide.
    "discriminator",
];

impl JsonSchema {
    /// Compiles `schema`, whose root must be an object schema.
    pub fn compile(schema: &Value) -> Result<JsonSchema, SchemaError> {
        let mut c = Compiler {
            root: schema,
            nodes: Vec::new(),
            first: Vec::new(),
            refs: Vec::new(),
            literal_bytes: 0,
            any: None,
        };
        let root = c.reserve()?;
        c.fill(root, schema, 1)?;
        if !matches!(
            c.nodes[0],
            Node::Object { .. } | Node::Tagged { .. } | Node::Map { .. }
        ) {
            return err("the schema's root must be an object (\"type\": \"object\")");
        }
        Ok(JsonSchema {
            nodes: c.nodes,
            first: c.first,
        })
    }

    /// One JSON object of any content: the schema `{"type": "object"}`, JSON mode's grammar.
    pub fn any_object() -> JsonSchema {
        JsonSchema::compile(&serde_json::json!({"type": "object"}))
            .expect("the schema of any object compiles")
    }

    pub(crate) fn node(&self, id: NodeId) -> &Node {
        &self.nodes[id as usize]
    }

    /// The properties an object node lists, and which are required: a tagged union's only
    /// its tag, until the tag picks the object.
    pub(crate) fn properties(&self, id: NodeId) -> Option<(&[Property], u64)> {
        match self.node(id) {
            Node::Object { props, required } => Some((props, *required)),
            Node::Tagged { head, .. } => Some((head, 1)),
            _ => None,
        }
    }

    /// Whether `b` can begin a value of node `id`.
    pub(crate) fn can_begin(&self, id: NodeId, b: u8) -> bool {
        begins(&self.first[id as usize], b)
    }
}

/// Whether `b` is in the byte set `set`.
fn begins(set: &[u64; 4], b: u8) -> bool {
    set[b as usize / 64] >> (b % 64) & 1 == 1
}

/// The first bytes of `node`, given those of the nodes it refers to (set before it).
fn first_bytes(node: &Node, first: &[[u64; 4]]) -> [u64; 4] {
    let mut set = [0u64; 4];
    let mut add = |b: u8| set[b as usize / 64] |= 1 << (b % 64);
    match node {
        Node::Object { .. } | Node::Tagged { .. } | Node::Map { .. } => add(b'{'),
        Node::Array { .. } => add(b'['),
        Node::String => add(b'"'),
        Node::Number { .. } => b"-0123456789".iter().for_each(|&b| add(b)),
        Node::Literals(texts) => texts.iter().for_each(|t| add(t[0])),
        Node::Union(alts) => {
            for &a in alts {
                for (s, f) in set.iter_mut().zip(first[a as usize]) {
                    *s |= f;
                }
            }
        }
    }
    set
}

struct Compiler<'a> {
    root: &'a Value,
    nodes: Vec<Node>,
    /// [`JsonSchema::first`], set with each node.
    first: Vec<[u64; 4]>,
    /// `$ref`s being inlined, outermost first (a reference to one of them recurses).
    refs: Vec<String>,
    /// Bytes of literal texts so far (see [`MAX_LITERAL_BYTES`]).
    literal_bytes: usize,
    /// The node of any JSON value, once a schema has needed it.
    any: Option<NodeId>,
}

impl<'a> Compiler<'a> {
    /// A placeholder node to fill in, so that a parent can be numbered before its children.
    fn reserve(&mut self) -> Result<NodeId, SchemaError> {
        if self.nodes.len() >= MAX_NODES {
            return err(format!("the schema has more than {MAX_NODES} nodes"));
        }
        self.nodes.push(Node::String);
        self.first.push([0; 4]);
        Ok((self.nodes.len() - 1) as NodeId)
    }

    /// Sets node `id`, whose children are already set.
    fn set(&mut self, id: NodeId, node: Node) -> Result<(), SchemaError> {
        if let Node::Literals(texts) = &node {
            self.literal_bytes += texts.iter().map(Vec::len).sum::<usize>();
            if self.literal_bytes > MAX_LITERAL_BYTES {
                return err(format!(
                    "the schema's \"enum\" and \"const\" values exceed {MAX_LITERAL_BYTES} bytes in all"
                ));
            }
        }
        self.first[id as usize] = first_bytes(&node, &self.first);
        self.nodes[id as usize] = node;
        Ok(())
    }

    fn child(&mut self, schema: &'a Value, depth: usize) -> Result<NodeId, SchemaError> {
        let id = self.reserve()?;
        self.fill(id, schema, depth)?;
        Ok(id)
    }

    /// Compiles `schema` into node `id`; `depth` counts the objects and arrays around it,
    /// itself included when it is one.
    fn fill(&mut self, id: NodeId, schema: &'a Value, depth: usize) -> Result<(), SchemaError> {
        match schema {
            Value::Bool(true) => return self.fill_any(id),
            Value::Bool(false) => return err("the schema false allows no value"),
            _ => {}
        }
        let Some(obj) = schema.as_object() else {
            return err(format!("a schema must be an object, not {schema}"));
        };
        if let Some(r) = obj.get("$ref") {
            if obj.len()
                > 1 + obj
                    .keys()
                    .filter(|k| ANNOTATIONS.contains(&k.as_str()))
                    .count()
            {
                return err("\"$ref\" with other constraining keywords is not supported");
            }
            return self.reference(id, r, depth);
        }
        for key in obj.keys() {
            let known = ANNOTATIONS.contains(&key.as_str())
                || matches!(
                    key.as_str(),
                    "type"
                        | "enum"
                        | "const"
                        | "anyOf"
                        | "oneOf"
                        | "properties"
                        | "required"
                        | "additionalProperties"
                        | "items"
                        | "minItems"
                        | "maxItems"
                );
            if !known {
                return err(format!("the schema keyword \"{key}\" is not supported"));
            }
        }
        // Object and array keywords need their type among the schema's types.
        let has_type = |t: &str| match obj.get("type") {
            Some(Value::String(u)) => u == t,
            Some(Value::Array(us)) => us.iter().any(|u| u == t),
            _ => false,
        };
        for (keys, ty) in [
            (
                &["properties", "required", "additionalProperties"][..],
                "object",
            ),
            (&["items", "minItems", "maxItems"][..], "array"),
        ] {
            if let Some(k) = keys.iter().find(|k| obj.contains_key(**k) && !has_type(ty)) {
                return err(format!("\"{k}\" applies only to \"type\": \"{ty}\""));
            }
        }
        // `enum`, `const` and the alternatives each decide the value alone; beside one
        // another, or beside keywords that would constrain what they list, one of them
        // would be ignored.
        let deciders = ["enum", "const", "anyOf", "oneOf"];
        let present: Vec<&str> = deciders
            .into_iter()
            .filter(|k| obj.contains_key(*k))
            .collect();
        let shaping = obj.keys().find(|k| {
            !ANNOTATIONS.contains(&k.as_str()) && !deciders.contains(&k.as_str()) && *k != "type"
        });
        match (&present[..], shaping) {
            ([a, b, ..], _) => return err(format!("\"{a}\" beside \"{b}\" is not supported")),
            ([a], Some(k)) => return err(format!("\"{a}\" beside \"{k}\" is not supported")),
            _ => {}
        }
        let node = if let Some(values) = obj.get("enum") {
            let Some(values) = values.as_array() else {
                return err("\"enum\" must be an array");
            };
            literals(values.iter().filter(|v| fits_type(obj, v)), "enum")?
        } else if let Some(v) = obj.get("const") {
            literals(std::iter::once(v).filter(|v| fits_type(obj, v)), "const")?
        } else if let Some(alts) = obj.get("anyOf").or_else(|| obj.get("oneOf")) {
            let Some(alts) = alts.as_array().filter(|a| !a.is_empty()) else {
                return err("\"anyOf\" and \"oneOf\" must be non-empty arrays");
            };
            if obj.contains_key("type") {
                return err("\"type\" beside \"anyOf\" or \"oneOf\" is not supported");
            }
            let ids = alts
                .iter()
                .map(|a| self.child(a, depth))
                .collect::<Result<Vec<_>, _>>()?;
            self.union(ids)?
        } else {
            match obj.get("type") {
                Some(Value::String(t)) => self.typed(obj, t, depth)?,
                Some(Value::Array(types)) if !types.is_empty() => {
                    let mut ids = Vec::new();
                    for t in types {
                        let Some(t) = t.as_str() else {
                            return err("\"type\" lists must hold strings");
                        };
                        // An integer is a number: "number" alone covers both.
                        let covered = t == "integer" && types.iter().any(|u| u == "number");
                        if !covered {
                            let sub = self.reserve()?;
                            let node = self.typed(obj, t, depth)?;
                            self.set(sub, node)?;
                            ids.push(sub);
                        }
                    }
                    self.union(ids)?
                }
                Some(other) => {
                    return err(format!("\"type\" must be a string or a list, not {other}"));
                }
                // Only annotations, or nothing: any value.
                None => return self.fill_any(id),
            }
        };
        self.set(id, node)
    }

    /// The node of any JSON value, made the first time it is needed: a union of an object of
    /// any keys and an array whose values are this node again, strings, numbers, booleans
    /// and null. Its depth is bounded by the grammar's, not the schema's.
    fn any(&mut self) -> Result<NodeId, SchemaError> {
        if let Some(any) = self.any {
            return Ok(any);
        }
        let any = self.reserve()?;
        let mut alts = Vec::new();
        for node in [
            Node::Map { values: any },
            Node::Array {
                items: any,
                min: 0,
                max: None,
            },
            Node::String,
            Node::Number { integer: false },
            Node::Literals(vec![b"false".to_vec(), b"null".to_vec(), b"true".to_vec()]),
        ] {
            let alt = self.reserve()?;
            self.set(alt, node)?;
            alts.push(alt);
        }
        let node = self.union(alts)?;
        self.set(any, node)?;
        self.any = Some(any);
        Ok(any)
    }

    /// Makes node `id` take any JSON value.
    fn fill_any(&mut self, id: NodeId) -> Result<(), SchemaError> {
        let any = self.any()?;
        let node = self.nodes[any as usize].clone();
        self.set(id, node)
    }

    /// Whether node `id` takes any JSON value.
    fn is_any(&self, id: NodeId) -> bool {
        self.any
            .is_some_and(|any| self.nodes[id as usize] == self.nodes[any as usize])
    }

    /// Inlines a local reference (`#/$defs/Name` or `#/definitions/Name`).
    fn reference(&mut self, id: NodeId, r: &Value, depth: usize) -> Result<(), SchemaError> {
        let Some(path) = r.as_str() else {
            return err("\"$ref\" must be a string");
        };
        let target = path
            .strip_prefix("#/")
            .map(|p| {
                p.split('/')
                    .map(|s| s.replace("~1", "/").replace("~0", "~"))
            })
            .and_then(|mut parts| parts.try_fold(self.root, |v, part| v.get(part.as_str())));
        let Some(target) = target else {
            return err(format!("\"$ref\" {path} does not point inside the schema"));
        };
        if self.refs.iter().any(|p| p == path) {
            return err(format!("recursive \"$ref\" {path} is not supported"));
        }
        self.refs.push(path.to_owned());
        let filled = self.fill(id, target, depth);
        self.refs.pop();
        filled
    }

    fn typed(
        &mut self,
        obj: &'a Map<String, Value>,
        ty: &str,
        depth: usize,
    ) -> Result<Node, SchemaError> {
        let container = matches!(ty, "object" | "array");
        if container && depth > MAX_DEPTH {
            return err(format!(
                "the schema nests objects and arrays more than {MAX_DEPTH} deep"
            ));
        }
        Ok(match ty {
            "object" => self.object(obj, depth + 1)?,
            "array" => {
                let items = obj.get("items");
                let count = |k: &str| -> Result<Option<u64>, SchemaError> {
                    match obj.get(k) {
                        None => Ok(None),
                        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
                            SchemaError(format!("\"{k}\" must be a non-negative integer"))
                        }),
                    }
                };
                let (min, max) = (count("minItems")?.unwrap_or(0), count("maxItems")?);
                if max.is_some_and(|m| m < min) {
                    return err("\"minItems\" is larger than \"maxItems\"");
                }
                let Ok(min) = u16::try_from(min) else {
                    return err(format!("\"minItems\" above {} is not supported", u16::MAX));
                };
                let items = match items {
                    Some(items) => self.child(items, depth + 1)?,
                    None => self.any()?,
                };
                Node::Array {
                    items,
                    min,
                    max: max.and_then(|m| u16::try_from(m).ok()),
                }
            }
            "string" => Node::String,
            "number" => Node::Number { integer: false },
            "integer" => Node::Number { integer: true },
            "boolean" => Node::Literals(vec![b"false".to_vec(), b"true".to_vec()]),
            "null" => Node::Literals(vec![b"null".to_vec()]),
            other => return err(format!("unknown \"type\": \"{other}\"")),
        })
    }

    /// An object schema: its listed properties when it lists any (and only those, whatever
    /// `additionalProperties` allows), else keys of any name with values of
    /// `additionalProperties` (any value when absent or true; none when false).
    fn object(&mut self, obj: &'a Map<String, Value>, depth: usize) -> Result<Node, SchemaError> {
        let props = match obj.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return err("\"properties\" must be an object"),
        };
        if props.is_none() && !obj.contains_key("required") {
            match obj.get("additionalProperties") {
                None | Some(Value::Bool(true)) => {
                    return Ok(Node::Map {
                        values: self.any()?,
                    });
                }
                Some(Value::Bool(false)) => {}
                Some(values) => {
                    return Ok(Node::Map {
                        values: self.child(values, depth)?,
                    });
                }
            }
        }
        let props = props.into_iter().flatten();
        if props.clone().count() > MAX_PROPERTIES {
            return err(format!(
                "an object schema may list at most {MAX_PROPERTIES} properties"
            ));
        }
        let mut required = 0u64;
        if let Some(req) = obj.get("required") {
            let Some(req) = req.as_array() else {
                return err("\"required\" must be an array of property names");
            };
            for name in req {
                let i = name
                    .as_str()
                    .and_then(|n| props.clone().position(|(k, _)| k == n));
                let Some(i) = i else {
                    return err(format!("required property {name} is not in \"properties\""));
                };
                required |= 1 << i;
            }
        }
        let mut out = Vec::new();
        for (name, schema) in props {
            let key = serde_json::to_vec(name).expect("a string serializes");
            out.push((key, self.child(schema, depth)?));
        }
        Ok(Node::Object {
            props: out,
            required,
        })
    }

    /// A union of `ids`, which must begin with different bytes; any value when one of them
    /// takes any.
    fn union(&mut self, ids: Vec<NodeId>) -> Result<Node, SchemaError> {
        if let Some(&any) = ids.iter().find(|&&i| self.is_any(i)) {
            return Ok(self.nodes[any as usize].clone());
        }
        let ids = self.tag_objects(ids)?;
        if let [only] = ids[..] {
            return Ok(self.nodes[only as usize].clone());
        }
        let first = &self.first;
        let clash = (0..=255u8).find(|&b| {
            ids.iter()
                .filter(|&&i| begins(&first[i as usize], b))
                .count()
                > 1
        });
        if let Some(b) = clash {
            return err(format!(
                "alternatives that can both begin with '{}' are not supported",
                b as char
            ));
        }
        Ok(Node::Union(ids))
    }

    /// `ids` with their objects joined into one tagged union, when there are several and
    /// each begins with the same required property whose value is one literal, a different
    /// one in each; otherwise `ids` as they are.
    fn tag_objects(&mut self, ids: Vec<NodeId>) -> Result<Vec<NodeId>, SchemaError> {
        let nodes = &self.nodes;
        let (objects, others): (Vec<NodeId>, Vec<NodeId>) = ids
            .iter()
            .partition(|&&i| matches!(nodes[i as usize], Node::Object { .. }));
        // Each object's (id, first key, tag text), if every object has a tag.
        let tag = |i: NodeId| match &nodes[i as usize] {
            Node::Object { props, required } if required & 1 == 1 => {
                match &nodes[props[0].1 as usize] {
                    Node::Literals(texts) if texts.len() == 1 => {
                        Some((i, props[0].0.clone(), texts[0].clone()))
                    }
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(mut tagged) = objects.into_iter().map(tag).collect::<Option<Vec<_>>>() else {
            return Ok(ids);
        };
        tagged.sort_by(|a, b| a.2.cmp(&b.2));
        let distinct = tagged.windows(2).all(|w| w[0].2 != w[1].2);
        let one_key = tagged.iter().all(|o| o.1 == tagged[0].1);
        if tagged.len() < 2 || !distinct || !one_key {
            return Ok(ids);
        }
        let tags = self.reserve()?;
        self.set(
            tags,
            Node::Literals(tagged.iter().map(|o| o.2.clone()).collect()),
        )?;
        let union = self.reserve()?;
        let node = Node::Tagged {
            head: vec![(tagged[0].1.clone(), tags)],
            objects: tagged.iter().map(|o| o.0).collect(),
        };
        self.set(union, node)?;
        Ok(std::iter::once(union).chain(others).collect())
    }
}

/// Whether `v` has one of the schema's `type`s (or the schema has none).
fn fits_type(obj: &Map<String, Value>, v: &Value) -> bool {
    let is = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.is_i64() || v.is_u64(),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    match obj.get("type") {
        None => true,
        Some(Value::String(t)) => is(t),
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).any(is),
        Some(_) => false,
    }
}

/// The compact JSON texts of `values`, sorted and distinct.
fn literals<'v>(
    values: impl Iterator<Item = &'v Value>,
    keyword: &str,
) -> Result<Node, SchemaError> {
    let mut texts: Vec<Vec<u8>> = values
        .map(|v| serde_json::to_vec(v).expect("a JSON value serializes"))
        .collect();
    texts.sort();
    texts.dedup();
    if texts.is_empty() {
        return err(format!(
            "\"{keyword}\" allows no value of the schema's type"
        ));
    }
    if texts.len() > MAX_ENUM {
        return err(format!("\"{keyword}\" may list at most {MAX_ENUM} values"));
    }
    Ok(Node::Literals(texts))
}

#[cfg(test)]
mod tests;
