//! Each structured-output field read into its constraint. Oracle: llguidance itself
//! ([`Constraint::accepts`]), fed texts written by hand that the field's rule allows or not.

use serde_json::json;

use super::*;

fn obj(v: Value) -> Obj {
    v.as_object().unwrap().clone()
}

fn held(body: Value) -> Constraint {
    let body = obj(body);
    let own = opt_object(&body, "response_format").unwrap();
    match requested(&body, Some(("response_format", own))) {
        Ok(OutputFormat::Held(c)) => (*c).clone(),
        other => panic!("{body:?}: {other:?}"),
    }
}

fn refused(body: Value) -> ApiError {
    let body = obj(body);
    let own = opt_object(&body, "response_format").unwrap();
    requested(&body, Some(("response_format", own))).unwrap_err()
}

#[test]
fn every_field_holds_the_output() {
    let person = json!({"type": "object", "properties": {"age": {"type": "integer", "minimum": 18}},
        "required": ["age"], "additionalProperties": false});
    let schema_fields = [
        json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "p", "strict": true, "schema": person}}}),
        json!({"structured_outputs": {"json": person}}),
        json!({"structured_outputs": {"json": person.to_string()}}),
        json!({"guided_json": person}),
        json!({"guided_json": person.to_string()}),
        json!({"json_schema": person}),
    ];
    for body in schema_fields {
        let c = held(body.clone());
        assert!(c.accepts(br#"{"age": 30}"#), "{body}");
        assert!(!c.accepts(br#"{"age": 3}"#), "{body}: minimum");
    }
    let c = held(json!({"response_format": {"type": "json_object"}}));
    assert!(c.accepts(br#"{"a": [1]}"#) && !c.accepts(b"[1]"));
    for body in [
        json!({"structured_outputs": {"regex": "[0-9]{3}-x"}}),
        json!({"guided_regex": "[0-9]{3}-x"}),
    ] {
        let c = held(body.clone());
        assert!(c.accepts(b"123-x") && !c.accepts(b"12-x"), "{body}");
    }
    let lark = "start: \"yes\" | \"no\"";
    for body in [
        json!({"structured_outputs": {"grammar": lark}}),
        json!({"guided_grammar": lark}),
        json!({"grammar": lark}),
        json!({"grammar": "root ::= \"yes\" | \"no\""}),
    ] {
        let c = held(body.clone());
        assert!(c.accepts(b"no") && !c.accepts(b"maybe"), "{body}");
    }
    let body = obj(json!({"response_format": {"type": "text"}, "structured_outputs": null}));
    assert_eq!(requested(&body, None).unwrap(), OutputFormat::Text);
}

#[test]
fn what_cannot_be_enforced_is_refused_by_name() {
    let cases = [
        (
            json!({"json_schema": {"type": "array", "uniqueItems": true}}),
            "json_schema",
            "uniqueItems",
        ),
        (
            json!({"guided_json": "{not json"}),
            "guided_json",
            "not valid JSON",
        ),
        (
            json!({"guided_regex": "(open"}),
            "guided_regex",
            "cannot be enforced",
        ),
        (json!({"grammar": "root ::= \"a"}), "grammar", "GBNF"),
        (
            json!({"guided_grammar": "start: nowhere"}),
            "guided_grammar",
            "cannot be enforced",
        ),
        (
            json!({"structured_outputs": {"choice": ["a"]}}),
            "structured_outputs.choice",
            "'choice'",
        ),
        (
            json!({"structured_outputs": {"regex": "a", "json": {}}}),
            "structured_outputs",
            "give one",
        ),
        (
            json!({"structured_outputs": {"regex": 3}}),
            "structured_outputs.regex",
            "string",
        ),
        (
            json!({"guided_regex": "a", "json_schema": {}}),
            "guided_regex",
            "give one",
        ),
        (
            json!({"response_format": {"type": "json_object"}, "grammar": "start: \"a\""}),
            "grammar",
            "give one",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
            "schema": {"type": "string", "format": "colour"}}}}),
            "response_format",
            "colour",
        ),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
            "needs a 'schema'",
        ),
        (
            json!({"response_format": {"type": "xml"}}),
            "response_format",
            "'xml'",
        ),
    ];
    for (body, param, says) in cases {
        let e = refused(body.clone());
        assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
        assert!(e.message.contains(says), "{body}: {e:?}");
    }
}

#[test]
fn reasoning_the_prompt_opened_comes_before_the_held_text() {
    let c = Arc::new(Constraint::regex("[0-9]+").unwrap());
    let output = |starts_in_reasoning, reasoning| OutputConfig {
        reasoning,
        starts_in_reasoning,
        tools: None,
    };
    let after = |o| match after_reasoning(OutputFormat::Held(Arc::clone(&c)), &o).unwrap() {
        OutputFormat::Held(c) => c,
        OutputFormat::Text => panic!("the format was dropped"),
    };
    assert!(after(output(true, ReasoningFormat::Think)).accepts(b"hmm</think>\n42"));
    assert!(!after(output(true, ReasoningFormat::Think)).accepts(b"42"));
    assert!(after(output(false, ReasoningFormat::Think)).accepts(b"42"));
    assert!(after(output(true, ReasoningFormat::None)).accepts(b"42"));
    assert_eq!(
        after_reasoning(OutputFormat::Text, &output(true, ReasoningFormat::Think)).unwrap(),
        OutputFormat::Text
    );
}
