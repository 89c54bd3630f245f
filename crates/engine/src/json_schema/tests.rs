//! What the compiler refuses, each with an error naming the cause, and what it takes apart
//! from the schema's own order.

use serde_json::json;

use super::*;

fn refusal(schema: Value) -> String {
    match JsonSchema::compile(&schema) {
        Ok(_) => panic!("compiled {schema}"),
        Err(e) => e.to_string(),
    }
}

fn object_with(prop: Value) -> Value {
    json!({"type": "object", "properties": {"p": prop}})
}

#[test]
fn schemas_it_cannot_enforce_are_refused_by_name() {
    let cases = [
        (json!({"type": "string"}), "root must be an object"),
        (json!([1]), "must be an object"),
        (
            object_with(json!({"type": "string", "pattern": "a+"})),
            "\"pattern\"",
        ),
        (
            object_with(json!({"type": "string", "minLength": 2})),
            "\"minLength\"",
        ),
        (
            object_with(json!({"type": "integer", "minimum": 0})),
            "\"minimum\"",
        ),
        (
            object_with(json!({"type": "string", "format": "date"})),
            "\"format\"",
        ),
        (object_with(json!(false)), "allows no value"),
        (json!({}), "root must be an object"),
        (json!(true), "root must be an object"),
        (object_with(json!({"type": "decimal"})), "unknown \"type\""),
        (object_with(json!({"type": 3})), "\"type\" must be"),
        (
            object_with(
                json!({"type": "array", "items": {"type": "null"}, "minItems": 3, "maxItems": 2}),
            ),
            "larger than",
        ),
        (
            object_with(json!({"type": "array", "items": {"type": "null"}, "minItems": -1})),
            "non-negative",
        ),
        (
            object_with(json!({"type": "string", "items": {"type": "null"}})),
            "applies only to",
        ),
        (object_with(json!({"enum": []})), "allows no value"),
        (
            object_with(json!({"type": "string", "enum": [1, 2]})),
            "allows no value",
        ),
        (
            object_with(json!({"anyOf": [{"type": "number"}, {"type": "integer"}]})),
            "both begin with '-'",
        ),
        (
            object_with(json!({"anyOf": [{"type": "string"}, {"enum": ["a"]}]})),
            "both begin with '\"'",
        ),
        (object_with(json!({"anyOf": []})), "non-empty"),
        (
            object_with(json!({"$ref": "#/$defs/Missing"})),
            "does not point inside",
        ),
        (
            json!({"$defs": {"N": {"type": "object", "properties": {"n": {"$ref": "#/$defs/N"}}}}, "$ref": "#/$defs/N"}),
            "recursive",
        ),
        (
            json!({"type": "object", "required": ["x"]}),
            "not in \"properties\"",
        ),
        (
            json!({"type": "object", "properties": (0..65).map(|i| (format!("p{i}"), json!({"type": "null"}))).collect::<Map<_, _>>()}),
            "at most 64 properties",
        ),
        (
            object_with(json!({"enum": (0..1025).collect::<Vec<_>>()})),
            "at most 1024 values",
        ),
        (
            object_with(json!({"anyOf": [{"enum": ["x", 5]}, {"type": "number"}]})),
            "both begin with '5'",
        ),
        (
            object_with(json!({"enum": ["a"], "const": "a"})),
            "\"enum\" beside \"const\"",
        ),
        (
            object_with(json!({"anyOf": [{"type": "null"}], "oneOf": [{"type": "null"}]})),
            "\"anyOf\" beside \"oneOf\"",
        ),
        (
            object_with(
                json!({"type": "object", "properties": {"a": {"type": "string"}}, "enum": [{"a": 1}]}),
            ),
            "\"enum\" beside \"properties\"",
        ),
        (
            object_with(json!({"type": "array", "items": {"type": "null"}, "const": [1]})),
            "\"const\" beside \"items\"",
        ),
        // A small request that would inline a megabyte of enum texts through `$ref`s.
        (
            json!({
                "$defs": {"Long": {"enum": (0..1000).map(|i| format!("{i:0>100}")).collect::<Vec<_>>()}},
                "type": "object",
                "properties": (0..11).map(|i| (format!("p{i}"), json!({"$ref": "#/$defs/Long"}))).collect::<Map<_, _>>()
            }),
            "exceed 1048576 bytes",
        ),
    ];
    for (schema, want) in cases {
        let got = refusal(schema.clone());
        assert!(got.contains(want), "{schema}: {got:?} lacks {want:?}");
    }
}

#[test]
fn nesting_past_the_grammars_depth_is_refused_and_up_to_it_compiles() {
    let nest = |levels: usize| {
        let mut s = json!({"type": "object"});
        for _ in 1..levels {
            s = json!({"type": "object", "properties": {"a": s}});
        }
        s
    };
    assert!(JsonSchema::compile(&nest(MAX_DEPTH)).is_ok());
    assert!(refusal(nest(MAX_DEPTH + 1)).contains("more than 32 deep"));
}

#[test]
fn nodes_keep_the_schemas_order_and_requirements() {
    let s = JsonSchema::compile(&json!({
        "type": "object",
        "properties": {"z": {"type": "integer"}, "a": {"type": ["string", "null"]}, "m": {"type": ["integer", "number"]}},
        "required": ["a"]
    }))
    .unwrap();
    let Node::Object { props, required } = s.node(0) else {
        panic!("{:?}", s.node(0));
    };
    let keys: Vec<&[u8]> = props.iter().map(|(k, _)| &k[..]).collect();
    assert_eq!(keys, [&b"\"z\""[..], b"\"a\"", b"\"m\""]);
    assert_eq!(*required, 0b010);
    assert_eq!(s.node(props[0].1), &Node::Number { integer: true });
    assert!(matches!(s.node(props[1].1), Node::Union(alts) if alts.len() == 2));
    // "integer" beside "number" is covered by "number".
    assert_eq!(s.node(props[2].1), &Node::Number { integer: false });
}

#[test]
fn values_a_schema_leaves_open_take_any_json() {
    let s = JsonSchema::compile(&json!({
        "type": "object",
        "properties": {
            "any": {"title": "Anything"},
            "yes": true,
            "map": {"type": "object"},
            "ints": {"type": "object", "additionalProperties": {"type": "integer"}},
            "none": {"type": "object", "additionalProperties": false},
            "list": {"type": "array", "maxItems": 2},
            "absorbed": {"anyOf": [{"type": "null"}, {}]},
            "listed": {"type": "object", "properties": {"a": {"type": "null"}}, "additionalProperties": true}
        }
    }))
    .unwrap();
    let Node::Object { props, .. } = s.node(0) else {
        panic!("{:?}", s.node(0));
    };
    let node = |i: usize| s.node(props[i].1);
    let Node::Union(alts) = node(0) else {
        panic!("{:?}", node(0));
    };
    let any = node(0).clone();
    let kinds: Vec<&Node> = alts.iter().map(|&a| s.node(a)).collect();
    assert!(matches!(kinds[0], Node::Map { values } if *s.node(*values) == any));
    assert!(matches!(kinds[1], Node::Array { items, min: 0, max: None } if *s.node(*items) == any));
    assert_eq!(
        kinds[2..4],
        [&Node::String, &Node::Number { integer: false }]
    );
    assert_eq!(
        kinds[4],
        &Node::Literals(vec![b"false".to_vec(), b"null".to_vec(), b"true".to_vec()])
    );
    assert_eq!(node(1), &any);
    assert!(matches!(node(2), Node::Map { values } if *s.node(*values) == any));
    assert!(
        matches!(node(3), Node::Map { values } if *s.node(*values) == Node::Number { integer: true })
    );
    assert_eq!(
        node(4),
        &Node::Object {
            props: Vec::new(),
            required: 0
        }
    );
    assert!(matches!(node(5), Node::Array { items, max: Some(2), .. } if *s.node(*items) == any));
    assert_eq!(node(6), &any);
    assert!(matches!(node(7), Node::Object { props, .. } if props.len() == 1));
    // One node of any value serves every open position.
    let maps = s
        .nodes
        .iter()
        .filter(|n| matches!(n, Node::Map { values } if *s.node(*values) == any));
    assert_eq!(maps.count(), 2, "the any value's own map and \"map\"");
}

#[test]
fn the_schema_of_any_object_is_a_map_of_any_values() {
    let s = JsonSchema::any_object();
    let Node::Map { values } = s.node(0) else {
        panic!("{:?}", s.node(0));
    };
    assert!(matches!(s.node(*values), Node::Union(alts) if alts.len() == 5));
}

fn tagged_pets() -> Value {
    json!({"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "cat"}, "lives": {"type": "integer"}}, "required": ["kind"]},
        {"type": "object", "properties": {"kind": {"enum": ["dog"]}, "good": {"type": "boolean"}}, "required": ["kind", "good"]}
    ]})
}

#[test]
fn objects_told_apart_by_a_first_literal_become_a_tagged_union() {
    let s = JsonSchema::compile(&object_with(tagged_pets())).unwrap();
    let Node::Object { props, .. } = s.node(0) else {
        panic!("{:?}", s.node(0));
    };
    let Node::Tagged { head, objects } = s.node(props[0].1) else {
        panic!("{:?}", s.node(props[0].1));
    };
    assert_eq!(head[0].0, b"\"kind\"");
    assert_eq!(
        s.node(head[0].1),
        &Node::Literals(vec![b"\"cat\"".to_vec(), b"\"dog\"".to_vec()])
    );
    assert!(matches!(s.node(objects[1]), Node::Object { props, .. } if props[1].0 == b"\"good\""));
    // Beside an alternative of another type; as the root; with OpenAPI's discriminator.
    let with_null = json!({"anyOf": [tagged_pets(), {"type": "null"}]});
    let s = JsonSchema::compile(&object_with(
        json!({"anyOf": [tagged_pets()["anyOf"][0], tagged_pets()["anyOf"][1], {"type": "null"}]}),
    ))
    .unwrap();
    let Node::Object { props, .. } = s.node(0) else {
        panic!()
    };
    assert!(matches!(s.node(props[0].1), Node::Union(alts) if alts.len() == 2));
    assert!(JsonSchema::compile(&object_with(with_null)).is_ok());
    assert!(matches!(
        JsonSchema::compile(&tagged_pets()).unwrap().node(0),
        Node::Tagged { .. }
    ));
    let mut discriminated = tagged_pets();
    discriminated["discriminator"] = json!({"propertyName": "kind"});
    discriminated["oneOf"] = discriminated["anyOf"].take();
    discriminated.as_object_mut().unwrap().remove("anyOf");
    assert!(JsonSchema::compile(&object_with(discriminated)).is_ok());
}

#[test]
fn objects_the_first_property_cannot_tell_apart_are_refused() {
    let pet = |tag: Value, required: Value| json!({"type": "object", "properties": {"kind": tag, "x": {"type": "null"}}, "required": required});
    let cases = [
        // The same tag twice.
        json!({"anyOf": [pet(json!({"const": "a"}), json!(["kind"])), pet(json!({"const": "a"}), json!(["kind"]))]}),
        // A tag that is not required.
        json!({"anyOf": [pet(json!({"const": "a"}), json!([])), pet(json!({"const": "b"}), json!(["kind"]))]}),
        // A tag of two values.
        json!({"anyOf": [pet(json!({"enum": ["a", "c"]}), json!(["kind"])), pet(json!({"const": "b"}), json!(["kind"]))]}),
        // Different first keys.
        json!({"anyOf": [pet(json!({"const": "a"}), json!(["kind"])), {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}]}),
        // An object without a tag beside tagged ones (it must not be dropped from the union).
        json!({"anyOf": [pet(json!({"const": "a"}), json!(["kind"])), pet(json!({"const": "b"}), json!(["kind"])), pet(json!({"type": "string"}), json!(["kind"]))]}),
        // A map beside tagged objects.
        json!({"anyOf": [pet(json!({"const": "a"}), json!(["kind"])), pet(json!({"const": "b"}), json!(["kind"])), {"type": "object"}]}),
    ];
    for schema in cases {
        let got = refusal(object_with(schema.clone()));
        assert!(got.contains("both begin with '{'"), "{schema}: {got}");
    }
}
