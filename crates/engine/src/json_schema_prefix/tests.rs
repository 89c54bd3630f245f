//! The schema grammar against two oracles: serde_json with a small JSON Schema validator
//! written from the specification (every text the grammar completes must be valid), and
//! hand-written valid texts (every prefix must be accepted, complete only at the end).

use serde_json::{Value, json};

use super::*;

/// A validator for the keywords the compiler takes, from the JSON Schema specification and
/// independent of the compiler: `$ref` resolved against `root`, properties not listed held
/// to `additionalProperties` (any value when it is absent), `true` and `false` schemas.
fn valid(v: &Value, schema: &Value, root: &Value) -> bool {
    if let Some(b) = schema.as_bool() {
        return b;
    }
    let s = schema.as_object().unwrap();
    if let Some(r) = s.get("$ref").and_then(Value::as_str) {
        let target = r[2..].split('/').fold(root, |node, part| &node[part]);
        return valid(v, target, root);
    }
    let type_ok = |t: &str| match t {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|x| x.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "null" => v.is_null(),
        _ => false,
    };
    let checks = [
        match s.get("type") {
            Some(Value::String(t)) => type_ok(t),
            Some(Value::Array(ts)) => ts.iter().any(|t| type_ok(t.as_str().unwrap())),
            _ => true,
        },
        s.get("enum")
            .is_none_or(|e| e.as_array().unwrap().contains(v)),
        s.get("const").is_none_or(|c| c == v),
        s.get("anyOf")
            .is_none_or(|alts| alts.as_array().unwrap().iter().any(|a| valid(v, a, root))),
        s.get("oneOf").is_none_or(|alts| {
            alts.as_array()
                .unwrap()
                .iter()
                .filter(|a| valid(v, a, root))
                .count()
                == 1
        }),
    ];
    if checks.contains(&false) {
        return false;
    }
    if let Some(obj) = v.as_object() {
        let props = s.get("properties").and_then(Value::as_object);
        for (k, x) in obj {
            let held_to = props
                .and_then(|p| p.get(k))
                .or_else(|| s.get("additionalProperties"));
            if held_to.is_some_and(|h| !valid(x, h, root)) {
                return false;
            }
        }
        let required = s.get("required").and_then(Value::as_array);
        if required.is_some_and(|r| r.iter().any(|k| !obj.contains_key(k.as_str().unwrap()))) {
            return false;
        }
    }
    if let Some(items) = v.as_array() {
        let n = items.len() as u64;
        let bound = |k: &str| s.get(k).and_then(Value::as_u64);
        if bound("minItems").is_some_and(|m| n < m) || bound("maxItems").is_some_and(|m| n > m) {
            return false;
        }
        if let Some(is) = s.get("items") {
            return items.iter().all(|x| valid(x, is, root));
        }
    }
    true
}

fn person() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age"],
        "additionalProperties": false
    })
}

fn nested() -> Value {
    json!({
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"]
            }
        },
        "type": "object",
        "title": "Shape",
        "properties": {
            "kind": {"enum": ["circle", "polygon", 7, null]},
            "points": {"type": "array", "items": {"$ref": "#/$defs/Point"}, "minItems": 2, "maxItems": 4},
            "label": {"anyOf": [{"type": "string"}, {"type": "null"}]},
            "weight": {"type": ["number", "null"]},
            "version": {"const": {"major": 1, "tags": ["a", "b"]}},
            "codes": {"type": "array", "items": {"enum": [1, 10, 100, -1.5]}},
            "mixed": {"anyOf": [{"enum": ["x", 5]}, {"type": "boolean"}, {"type": "array", "items": {"type": "null"}}]}
        },
        "required": ["kind", "points", "version"]
    })
}

/// Values the schema leaves open, alone and beside typed ones.
fn loose() -> Value {
    json!({
        "type": "object",
        "properties": {
            "meta": {"description": "anything"},
            "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
            "tags": {"type": "array", "maxItems": 3},
            "none": {"type": "object", "additionalProperties": false},
            "extra": {"type": "object"},
            "maybe": {"anyOf": [{"type": "string"}, true]},
            "n": {"type": "integer"}
        },
        "required": ["meta", "counts"]
    })
}

/// Discriminated unions: tags that share a prefix (`"cat"`, `"catfish"`), and numeric tags
/// one of which is a prefix of the other (`1`, `10`), beside null.
fn tagged() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pet": {"oneOf": [
                {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}},
                    "required": ["kind", "lives"], "additionalProperties": false},
                {"type": "object", "properties": {"kind": {"const": "catfish"}, "fins": {"type": "integer"}},
                    "required": ["kind"], "additionalProperties": false},
                {"type": "object", "properties": {"kind": {"const": "dog"}}, "required": ["kind"],
                    "additionalProperties": false}
            ], "discriminator": {"propertyName": "kind"}},
            "level": {"anyOf": [
                {"type": "object", "properties": {"v": {"const": 1}, "a": {"type": "string"}},
                    "required": ["v"], "additionalProperties": false},
                {"type": "object", "properties": {"v": {"const": 10}, "b": {"type": "boolean"}},
                    "required": ["v", "b"], "additionalProperties": false},
                {"type": "null"}
            ]}
        },
        "required": ["pet", "level"],
        "additionalProperties": false
    })
}

fn compile(schema: &Value) -> JsonSchema {
    JsonSchema::compile(schema).unwrap_or_else(|e| panic!("{schema}: {e}"))
}

fn accepts(s: &JsonSchema, text: &str) -> Option<SchemaPrefix> {
    SchemaPrefix::new().feed(s, text.as_bytes())
}

#[test]
fn valid_texts_are_accepted_byte_by_byte_and_complete_only_at_the_end() {
    let cases = [
        (person(), r#"{"name": "Ada", "age": 36}"#),
        (
            person(),
            r#"{"name":"A\"b\u00e9","age":-0,"tags":[],"ok":true}"#,
        ),
        (
            person(),
            "{\n  \"name\": \"x\",\n  \"age\": 7,\n  \"tags\": [\"a\", \"b\", \"c\"]\n}",
        ),
        (person(), r#"{"name":"","age":120,"ok":false}"#),
        (
            nested(),
            r#"{"kind":"circle","points":[{"x":1,"y":-2.5e3},{"x":0.5,"y":7}],"version":{"major":1,"tags":["a","b"]}}"#,
        ),
        (
            nested(),
            r#"{"kind":7,"points":[{"x":1,"y":2},{"x":3,"y":4},{"x":5,"y":6}],"label":null,"weight":3.25,"version":{"major":1,"tags":["a","b"]},"codes":[10,1,100,-1.5]}"#,
        ),
        (
            nested(),
            r#"{"kind":null,"points":[{"x":1,"y":2},{"x":3,"y":4}],"label":"hi","weight":null,"version":{"major":1,"tags":["a","b"]},"codes":[]}"#,
        ),
    ];
    let tagged_cases = [
        r#"{"pet":{"kind":"cat","lives":9},"level":null}"#,
        r#"{"pet": {"kind": "catfish"}, "level": {"v": 1}}"#,
        r#"{"pet":{"kind":"catfish","fins":2},"level":{"v":1,"a":"x"}}"#,
        r#"{"pet":{"kind":"dog"},"level":{"v":10,"b":true}}"#,
        r#"{"pet":{ "kind" : "dog" },"level":{ "v" : 10 , "b" : false }}"#,
    ]
    .map(|t| (tagged(), t.to_string()));
    let loose_cases = [
        r#"{"meta":null,"counts":{}}"#,
        r#"{"meta":{"a":[1,{"b":"c"}],"a":true},"counts":{"x":1,"x":-2,"\u00e9\"":30}}"#,
        r#"{"meta": [[], {}, "s", -1.5e-3, false], "counts": {"k": 0}, "tags": [null, {"t": []}, 3], "none": {}, "extra": {"e": {"f": [true]}}, "maybe": "m", "n": 4}"#,
        r#"{"meta":"x","counts":{},"maybe":{"any":1}}"#,
        r#"{"meta":7,"counts":{},"maybe":[1,"2"]}"#,
    ]
    .map(|t| (loose(), t.to_string()));
    let with_mixed = |m: &str| {
        format!(
            r#"{{"kind":7,"points":[{{"x":1,"y":2}},{{"x":3,"y":4}}],"version":{{"major":1,"tags":["a","b"]}},"mixed":{m}}}"#
        )
    };
    let mixed: Vec<(Value, String)> = ["5", r#""x""#, "true", "[null,null]", "[]"]
        .iter()
        .map(|m| (nested(), with_mixed(m)))
        .collect();
    let cases = cases
        .iter()
        .map(|(s, t)| (s.clone(), t.to_string()))
        .chain(mixed)
        .chain(loose_cases)
        .chain(tagged_cases);
    for (schema, text) in cases {
        let (schema, text) = (&schema, text.as_str());
        let v: Value = serde_json::from_str(text).unwrap();
        assert!(valid(&v, schema, schema), "the oracle refuses {text}");
        let s = compile(schema);
        let mut p = SchemaPrefix::new();
        for (i, b) in text.bytes().enumerate() {
            assert!(!p.is_complete(), "{text:?} complete after {i} bytes");
            p = p
                .feed(&s, &[b])
                .unwrap_or_else(|| panic!("{text:?} refused at byte {i}"));
        }
        assert!(p.is_complete(), "{text:?}");
        assert!(p.feed(&s, b" ").is_none() && p.feed(&s, b"{").is_none());
    }
}

#[test]
fn texts_outside_the_schema_are_refused() {
    let (p, n, l) = (compile(&person()), compile(&nested()), compile(&loose()));
    let t = compile(&tagged());
    let refused = [
        (&t, r#"{"pet":{"lives""#),                          // the tag comes first
        (&t, r#"{"pet":{}"#),                                // the tag is required
        (&t, r#"{"pet":{"kind":"cow""#),                     // not a tag
        (&t, r#"{"pet":{"kind":"cat"}"#),                    // the cat's lives are required
        (&t, r#"{"pet":{"kind":"cat","fins""#),              // the catfish's property
        (&t, r#"{"pet":{"kind":"dog","lives""#),             // the cat's property
        (&t, r#"{"pet":{"kind":"dog"},"level":{"v":1,"b""#), // 10's property after 1
        (&t, r#"{"pet":{"kind":"dog"},"level":{"v":10}"#),   // 10 requires b
        (&t, r#"{"pet":{"kind":"dog"},"level":{"v":100"#),   // not a tag
        (&t, r#"{"pet":{"kind":"dog"},"level":{"v":10,"a""#), // 1's property after 10
        (&l, r#"{"counts""#),                                // meta first
        (&l, r#"{"meta": 1, "counts": {"a": 1.5"#),          // map values are integers
        (&l, r#"{"meta": 1, "counts": {"a": "1""#),          // map values are integers
        (&l, r#"{"meta": 1, "counts": {a"#),                 // keys are strings
        (&l, r#"{"meta": 1, "counts": {"a" 1"#),             // a colon after a key
        (&l, r#"{"meta": 1, "counts": {"a": 1,}"#),          // no trailing comma
        (&l, r#"{"meta": 1, "counts": {}, "none": {""#),     // no keys at all
        (&l, r#"{"meta": 1, "counts": {}, "tags": [1,2,3,4"#), // maxItems 3
        (&l, r#"{"meta": 1, "counts": {}, "extra": ["#),     // an object
        (&l, r#"{"meta": [1}"#),                             // brackets match
        (&l, r#"{"meta": tru}"#),
        (&l, r#"{"meta": {"a": 1}}}"#),
        (&p, r#"{"age": 1"#),                       // order: name first
        (&p, r#"{"name": "a", "ok": true"#),        // age is required
        (&p, r#"{"name": "a"}"#),                   // closed without age
        (&p, r#"{"name": "a", "age": 1.5"#),        // an integer
        (&p, r#"{"name": "a", "age": 1e3"#),        // an integer
        (&p, r#"{"name": 1"#),                      // a string
        (&p, r#"{"name": "a", "age": 1, "extra""#), // not listed
        (&p, r#"{"name": "a", "age": 1, "tags": ["a","b","c","d""#), // maxItems 3
        (&p, r#"{"name": "a", "age": 1, "ok": tru}"#),
        (&p, r#"{"name": "a", "age": 1, "age""#), // no property twice
        (&p, r#"{"nam": "#),
        (&p, r#"["#),
        (&n, r#"{"kind": "square""#),
        (&n, r#"{"kind": 70"#),
        (&n, r#"{"kind": 7, "points": [{"x": 1, "y": 2}]"#), // minItems 2
        (&n, r#"{"kind": 7, "points": [{"x": 1}"#),          // y is required
        (
            &n,
            r#"{"kind": 7, "points": [], "version": {"major": 1, "tags": ["a"]"#,
        ),
        (&n, r#"{"kind": 7, "points": [], "version": {"major":1"#), // const's compact text
    ];
    for (s, text) in refused {
        assert!(accepts(s, text).is_none(), "accepted {text}");
    }
    // Completeness: a text can end only where the schema allows.
    assert!(
        !accepts(&p, r#"{"name": "a", "age": 1"#)
            .unwrap()
            .is_complete()
    );
}

/// Bytes a random walk tries: printable ASCII and newline.
fn alphabet() -> Vec<u8> {
    (0x20..0x7f).chain([b'\n']).collect()
}

/// A random walk over the grammar's allowed bytes (closing bytes favoured, so that texts
/// end), up to `cap` bytes; the text when it completed.
fn walk(s: &JsonSchema, seed: u64, cap: usize) -> Option<String> {
    let mut rng = crate::rng::Rng::new(seed);
    let mut p = SchemaPrefix::new();
    let mut text = Vec::new();
    let bytes = alphabet();
    while text.len() < cap {
        if p.is_complete() {
            return Some(String::from_utf8(text).unwrap());
        }
        let allowed: Vec<(u8, SchemaPrefix)> = bytes
            .iter()
            .filter_map(|&b| p.feed(s, &[b]).map(|q| (b, q)))
            .collect();
        assert!(
            !allowed.is_empty(),
            "dead end after {:?}",
            String::from_utf8_lossy(&text)
        );
        let weight = |b: u8| if b"\"}],".contains(&b) { 30 } else { 1 };
        let total: u64 = allowed.iter().map(|(b, _)| weight(*b)).sum();
        let mut pick = (rng.next_f64() * total as f64) as u64;
        let mut chosen = allowed[allowed.len() - 1];
        for &(b, q) in &allowed {
            if pick < weight(b) {
                chosen = (b, q);
                break;
            }
            pick -= weight(b);
        }
        let (b, q) = chosen;
        text.push(b);
        p = q;
    }
    None
}

#[test]
fn every_text_a_random_walk_completes_is_valid_against_the_schema() {
    for schema in [person(), nested(), loose(), tagged()] {
        let s = compile(&schema);
        let mut done = 0;
        for seed in 0..300 {
            let Some(text) = walk(&s, seed, 3000) else {
                continue;
            };
            let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
            assert!(valid(&v, &schema, &schema), "invalid: {text}");
            done += 1;
        }
        assert!(done > 150, "only {done} of 300 walks completed");
    }
}

#[test]
fn the_validator_oracle_sees_planted_violations() {
    let (p, n, l, t) = (person(), nested(), loose(), tagged());
    for (schema, bad) in [
        (&t, json!({"pet": {"kind": "cat"}, "level": null})),
        (
            &t,
            json!({"pet": {"kind": "dog", "lives": 1}, "level": null}),
        ),
        (&t, json!({"pet": {"kind": "dog"}, "level": {"v": 10}})),
        (&l, json!({"meta": 1, "counts": {"a": 1.5}})),
        (&l, json!({"meta": 1, "counts": {}, "none": {"a": 1}})),
        (&l, json!({"meta": 1, "counts": {}, "extra": []})),
        (&l, json!({"counts": {}})),
        (&p, json!({"name": "a"})),
        (&p, json!({"name": "a", "age": 1.5})),
        (&p, json!({"name": "a", "age": 1, "x": 1})),
        (
            &p,
            json!({"name": "a", "age": 1, "tags": ["a", "b", "c", "d"]}),
        ),
        (
            &n,
            json!({"kind": "square", "points": [], "version": {"major": 1, "tags": ["a", "b"]}}),
        ),
        (
            &n,
            json!({"kind": 7, "points": [{"x": 1, "y": 2}], "version": {"major": 1, "tags": ["a", "b"]}}),
        ),
        (
            &n,
            json!({"kind": 7, "points": [{"x": 1}, {"x": 1, "y": 2}], "version": {"major": 1, "tags": ["a", "b"]}}),
        ),
    ] {
        assert!(!valid(&bad, schema, schema), "{bad}");
    }
}

#[test]
fn a_large_enum_takes_each_value_whole_and_nothing_else() {
    // Numbers whose texts are prefixes of each other ("1", "10", "100"), and strings alike.
    let mut values: Vec<Value> = (0..1000).map(|n| json!(n)).collect();
    values.extend(["a", "ab", "abc", "b"].map(|t| json!(t)));
    let s = compile(
        &json!({"type": "object", "properties": {"v": {"enum": values}}, "required": ["v"]}),
    );
    for v in &values {
        let text = format!(r#"{{"v": {v}}}"#);
        assert!(
            accepts(&s, &text).is_some_and(|p| p.is_complete()),
            "{text}"
        );
    }
    for text in [
        r#"{"v": 1000}"#,
        r#"{"v": 01}"#,
        r#"{"v": -1}"#,
        r#"{"v": "abcd"}"#,
        r#"{"v": "c"}"#,
        r#"{"v": 1.0}"#,
    ] {
        assert!(accepts(&s, text).is_none_or(|p| !p.is_complete()), "{text}");
    }
}
