//! Scripted outputs through the parser, each fed whole, split at every byte boundary (so
//! every marker is split at every point), and one character per token: all feedings must
//! give the same result, and arguments must add up to the final text. Expected values are
//! read off each family's documented format.

use super::super::{Call, Collected, OutputConfig, ReasoningFormat, ToolSyntax};
use super::*;

fn config(reasoning: ReasoningFormat, tools: Option<ToolSyntax>) -> OutputConfig {
    OutputConfig {
        reasoning,
        starts_in_reasoning: false,
        tools,
    }
}

fn feed(config: OutputConfig, pieces: &[&str]) -> (Collected, Finish, Vec<Event>) {
    let mut p = OutputParser::new(config);
    let mut events = Vec::new();
    for piece in pieces {
        events.extend(p.push(piece, false));
    }
    let fin = p.finish();
    events.extend(fin.events.clone());
    let mut c = Collected::default();
    c.extend(events.clone());
    (c, fin, events)
}

/// Parse `text` every way it can be split; all must agree; returns the result.
fn check(config: OutputConfig, text: &str) -> (Collected, Finish) {
    let (whole, fin, _) = feed(config, &[text]);
    for cut in (1..text.len()).filter(|&c| text.is_char_boundary(c)) {
        let (split, f2, _) = feed(config, &[&text[..cut], &text[cut..]]);
        assert_eq!(
            split,
            whole,
            "split at {cut}: {:?} | {:?}",
            &text[..cut],
            &text[cut..]
        );
        assert_eq!(f2.unfinished_call, fin.unfinished_call, "split at {cut}");
        assert_eq!(
            f2.unclosed_reasoning, fin.unclosed_reasoning,
            "split at {cut}"
        );
    }
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let refs: Vec<&str> = chars.iter().map(String::as_str).collect();
    let (by_char, _, _) = feed(config, &refs);
    assert_eq!(by_char, whole, "one character per token");
    (whole, fin)
}

fn call(name: &str, arguments: &str) -> Call {
    Call {
        name: name.into(),
        arguments: arguments.into(),
        complete: true,
    }
}

fn think() -> OutputConfig {
    config(ReasoningFormat::Think, Some(ToolSyntax::Hermes))
}

#[test]
fn think_blocks_are_reasoning_and_never_content() {
    let (c, f) = check(think(), "<think>I reason</think>\n\nAnswer.");
    assert_eq!(
        (c.reasoning.as_str(), c.content.as_str()),
        ("I reason", "Answer.")
    );
    assert!(!f.unclosed_reasoning);
    // Opened by the template: the output starts inside reasoning.
    let opened = OutputConfig {
        starts_in_reasoning: true,
        ..think()
    };
    let (c, _) = check(opened, "I reason</think>Answer.");
    assert_eq!(
        (c.reasoning.as_str(), c.content.as_str()),
        ("I reason", "Answer.")
    );
    let (c, _) = check(opened, "<think>I reason</think>Answer.");
    assert_eq!(c.reasoning, "I reason");
    // Without reasoning at the start, `<think>` later on is text.
    let (c, _) = check(think(), "Hi <think>x</think>");
    assert_eq!(
        (c.reasoning.as_str(), c.content.as_str()),
        ("", "Hi <think>x")
    );
    let none = config(ReasoningFormat::None, None);
    let (c, _) = check(none, "<think>a</think>b");
    assert_eq!(c.content, "<think>a</think>b");
}

#[test]
fn unterminated_and_twice_closed_reasoning_stay_out_of_content() {
    let (c, f) = check(think(), "<think>thinking forever");
    assert_eq!(
        (c.reasoning.as_str(), c.content.as_str()),
        ("thinking forever", "")
    );
    assert!(f.unclosed_reasoning);
    let (c, f) = check(think(), "<think>a</think>b</think>c");
    assert_eq!((c.reasoning.as_str(), c.content.as_str()), ("a", "bc"));
    assert!(!f.unclosed_reasoning);
}

#[test]
fn a_whole_call_inside_unclosed_reasoning_is_recovered_once() {
    let text =
        "<think>let me call <tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
    let (c, f) = check(think(), text);
    assert_eq!(c.reasoning, "let me call ");
    assert_eq!(c.calls, [call("f", "{\"x\": 1}")]);
    assert_eq!(c.content, "");
    assert!(f.unclosed_reasoning);
    // Closed reasoning keeps a block it mentions as reasoning: no call.
    let mused =
        "<think>maybe <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> no</think>Done";
    let (c, _) = check(think(), mused);
    assert_eq!(
        c.reasoning,
        "maybe <tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call> no"
    );
    assert!(c.calls.is_empty());
    assert_eq!(c.content, "Done");
    // An unfinished block inside unclosed reasoning is reasoning; nothing is completed.
    let cut = "<think>x <tool_call>{\"name\": \"f\", \"argu";
    let (c, _) = check(think(), cut);
    assert_eq!(c.reasoning, "x <tool_call>{\"name\": \"f\", \"argu");
    assert!(c.calls.is_empty());
    // A `</think>` inside a call's arguments is the call's text.
    let inside =
        "<think>go <tool_call>{\"name\": \"f\", \"arguments\": {\"s\": \"</think>\"}}</tool_call>";
    let (c, _) = check(think(), inside);
    assert_eq!(c.reasoning, "go ");
    assert_eq!(c.calls, [call("f", "{\"s\": \"</think>\"}")]);
}

#[test]
fn hermes_calls_with_literal_markers_escapes_and_cuts() {
    let text = "Sure. <tool_call>\n{\"name\": \"get\", \"arguments\": {\"q\": \"</tool_call> \\\"<think>\\\"\"}}\n</tool_call>";
    let (c, f) = check(think(), text);
    assert_eq!(c.content, "Sure. ");
    assert_eq!(
        c.calls,
        [call("get", "{\"q\": \"</tool_call> \\\"<think>\\\"\"}")]
    );
    assert!(!f.unfinished_call);
    let two = "<tool_call>{\"name\": \"a\", \"arguments\": {}}</tool_call>\n<tool_call>{\"name\": \"b\", \"arguments\": {\"n\": 2}}</tool_call>";
    let (c, _) = check(think(), two);
    assert_eq!(c.calls, [call("a", "{}"), call("b", "{\"n\": 2}")]);
    assert_eq!(c.content, "\n");
    // Cut off: announced maybe, never complete, never content.
    let (c, f) = check(
        think(),
        "<tool_call>{\"name\": \"get\", \"arguments\": {\"q\": 1",
    );
    assert_eq!(c.complete_calls().count(), 0);
    assert_eq!(c.content, "");
    assert!(f.unfinished_call);
    // Not a call at all: the text is the answer's.
    let (c, f) = check(think(), "use <tool_call> tags");
    assert_eq!(c.content, "use <tool_call> tags");
    assert!(c.calls.is_empty() && !f.unfinished_call);
}

#[test]
fn arguments_stream_before_the_call_ends() {
    let text = "<tool_call>{\"name\": \"get\", \"arguments\": {\"city\": \"Paris\"}}</tool_call>";
    let chars: Vec<String> = text.chars().map(String::from).collect();
    let mut p = OutputParser::new(think());
    let mut deltas = 0;
    let close_at = text.find("</tool_call>").unwrap();
    for (i, ch) in chars.iter().enumerate() {
        for ev in p.push(ch, false) {
            match ev {
                Event::ToolArgs { .. } if i < close_at => deltas += 1,
                Event::ToolEnd { .. } => assert!(i >= close_at, "ended early at {i}"),
                _ => {}
            }
        }
    }
    assert!(
        deltas > 5,
        "arguments came in {deltas} pieces before the close"
    );
}

#[test]
fn qwen3_coder_parameters_end_only_before_the_next_tag() {
    let text = "<tool_call>\n<function=get>\n<parameter=city>\nPa</parameter>ris\n</parameter>\n<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>";
    let (c, f) = check(
        config(ReasoningFormat::Think, Some(ToolSyntax::Qwen3Coder)),
        text,
    );
    assert_eq!(
        c.calls,
        [call("get", "{\"city\":\"Pa</parameter>ris\",\"n\":3}")]
    );
    assert_eq!(c.content, "");
    assert!(!f.unfinished_call);
    let cut = "<tool_call>\n<function=get>\n<parameter=city>\nPar";
    let (c, f) = check(
        config(ReasoningFormat::Think, Some(ToolSyntax::Qwen3Coder)),
        cut,
    );
    assert_eq!(c.complete_calls().count(), 0);
    assert!(f.unfinished_call);
}

#[test]
fn glm_arguments() {
    let text = "<think>hm</think><tool_call>get\n<arg_key>city</arg_key>\n<arg_value>Os</arg_value>lo</arg_value>\n<arg_key>n</arg_key>\n<arg_value>2</arg_value>\n</tool_call>";
    let (c, _) = check(
        config(ReasoningFormat::Think, Some(ToolSyntax::Glm45)),
        text,
    );
    assert_eq!(c.reasoning, "hm");
    assert_eq!(
        c.calls,
        [call("get", "{\"city\":\"Os</arg_value>lo\",\"n\":2}")]
    );
    let (c, _) = check(
        config(ReasoningFormat::Think, Some(ToolSyntax::Glm45)),
        "<tool_call>{\"x\"",
    );
    assert_eq!(c.content, "<tool_call>{\"x\"");
}

#[test]
fn llama3_bare_json_and_python_tag() {
    let l3 = config(ReasoningFormat::Think, Some(ToolSyntax::Llama3));
    let (c, _) = check(
        l3,
        "{\"name\": \"get\", \"parameters\": {\"city\": \"Oslo\"}}",
    );
    assert_eq!(c.calls, [call("get", "{\"city\": \"Oslo\"}")]);
    let (c, _) = check(
        l3,
        "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {}}",
    );
    assert_eq!(c.calls, [call("a", "{}"), call("b", "{}")]);
    // Cut off inside the arguments: never a call.
    let (c, f) = check(
        l3,
        "<|python_tag|>{\"name\": \"get\", \"parameters\": {\"city\": \"Os",
    );
    assert_eq!(c.complete_calls().count(), 0);
    assert!(f.unfinished_call, "{c:?}");
    // JSON the user asked for is no call.
    let (c, _) = check(l3, "{\"name\": \"Bob\", \"age\": 3}");
    assert_eq!(c.content, "{\"name\": \"Bob\", \"age\": 3}");
    assert!(c.calls.is_empty());
}

#[test]
fn mistral_arrays_and_named_calls() {
    let m = config(ReasoningFormat::Think, Some(ToolSyntax::Mistral));
    let arr = "[TOOL_CALLS][{\"name\": \"get\", \"arguments\": {\"c\": \"]\"}}, {\"name\": \"put\", \"arguments\": {}}]";
    let (c, _) = check(m, arr);
    assert_eq!(c.calls, [call("get", "{\"c\": \"]\"}"), call("put", "{}")]);
    let named = "ok[TOOL_CALLS]get[ARGS]{\"c\": 1}[TOOL_CALLS]put[ARGS]{}";
    let (c, _) = check(m, named);
    assert_eq!(c.content, "ok");
    assert_eq!(c.calls, [call("get", "{\"c\": 1}"), call("put", "{}")]);
    let (c, f) = check(m, "[TOOL_CALLS]get[ARGS]{\"c\": ");
    assert_eq!(c.complete_calls().count(), 0);
    assert!(f.unfinished_call);
}

#[test]
fn deepseek_v3_and_v31_calls() {
    let d = config(ReasoningFormat::Think, Some(ToolSyntax::DeepSeek));
    let v3 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{\"c\": \"<｜tool▁call▁end｜>\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (c, f) = check(d, v3);
    assert_eq!(c.calls, [call("get", "{\"c\": \"<｜tool▁call▁end｜>\"}")]);
    assert!(!f.unfinished_call);
    let v31 = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>a<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁call▁begin｜>b<｜tool▁sep｜>{\"n\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    let (c, _) = check(d, v31);
    assert_eq!(c.calls, [call("a", "{}"), call("b", "{\"n\": 1}")]);
    // Cut off inside the arguments: never a call, never content.
    let cut =
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{\"c\": ";
    let (c, f) = check(d, cut);
    assert_eq!(c.complete_calls().count(), 0);
    assert_eq!(c.content, "");
    assert!(f.unfinished_call);
}

#[test]
fn harmony_channels() {
    let h = config(ReasoningFormat::Harmony, Some(ToolSyntax::Harmony));
    let text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>final<|message|>Hi<|return|>";
    let (c, f) = check(h, text);
    assert_eq!((c.reasoning.as_str(), c.content.as_str()), ("think", "Hi"));
    assert!(!f.unclosed_reasoning);
    let tool = "<|channel|>analysis<|message|>t<|end|><|start|>assistant<|channel|>commentary to=functions.get <|constrain|>json<|message|>{\"c\": \"<|call|>\"}";
    let (c, _) = check(h, tool);
    assert_eq!(c.reasoning, "t");
    // `<|call|>` inside the JSON string: harmony has no escape, the marker ends the body.
    assert_eq!(c.complete_calls().count(), 0);
    let tool =
        "<|channel|>commentary to=functions.get <|constrain|>json<|message|>{\"c\": 1}<|call|>";
    let (c, _) = check(h, tool);
    assert_eq!(c.calls, [call("get", "{\"c\": 1}")]);
    let (c, _) = check(h, "plain words");
    assert_eq!(c.content, "plain words");
}

#[test]
fn special_tokens_are_markers_or_nothing() {
    let mut p = OutputParser::new(think());
    let mut c = Collected::default();
    c.extend(p.push("<think>", true));
    c.extend(p.push("r", false));
    c.extend(p.push("</think>", true));
    c.extend(p.push("a", false));
    c.extend(p.push("<|im_end|>", true));
    let f = p.finish();
    c.extend(f.events);
    assert_eq!((c.reasoning.as_str(), c.content.as_str()), ("r", "a"));
    assert_eq!(f.reasoning_tokens, 3);
}

#[test]
fn formats_and_syntaxes_come_from_the_template() {
    use super::super::ToolSyntax as T;
    assert_eq!(T::detect("<tool_call>\n{\"name\""), Some(T::Hermes));
    assert_eq!(
        T::detect("<tool_call>\n<function=x>\n<parameter=y>"),
        Some(T::Qwen3Coder)
    );
    assert_eq!(T::detect("<tool_call>{{ name }}<arg_key>"), Some(T::Glm45));
    assert_eq!(T::detect("[AVAILABLE_TOOLS]"), Some(T::Mistral));
    assert_eq!(T::detect("<｜tool▁calls▁begin｜>"), Some(T::DeepSeek));
    assert_eq!(T::detect("<|start|>assistant<|channel|>"), Some(T::Harmony));
    assert_eq!(T::detect("<|python_tag|>"), Some(T::Llama3));
    assert_eq!(T::detect("plain"), None);
    let cfg = OutputConfig::for_prompt(ReasoningFormat::Auto, "", "<｜Assistant｜><think>\n", None);
    assert_eq!(cfg.reasoning, ReasoningFormat::Think);
    assert!(cfg.starts_in_reasoning);
    let cfg = OutputConfig::for_prompt(
        ReasoningFormat::Auto,
        "",
        "assistant\n<think>\n\n</think>\n\n",
        None,
    );
    assert!(!cfg.starts_in_reasoning);
    let cfg = OutputConfig::for_prompt(ReasoningFormat::Auto, "<|channel|>", "", None);
    assert_eq!(cfg.reasoning, ReasoningFormat::Harmony);
    let fresh = "<|start|>user<|message|>hi<|end|><|start|>assistant";
    let cfg = OutputConfig::for_prompt(ReasoningFormat::Auto, fresh, fresh, None);
    assert_eq!(cfg.reasoning, ReasoningFormat::Harmony);
    assert_eq!(
        "think".parse::<ReasoningFormat>().unwrap(),
        ReasoningFormat::Think
    );
    assert!("thinking".parse::<ReasoningFormat>().is_err());
}

/// Each syntax's arguments come as deltas while the model writes them, not in one piece at
/// the call's close: fed one character per token, the pieces must add up to the call's
/// arguments, and enough of them must come before the first byte of `close`, the end of
/// the value: a long string value in many pieces, in the JSON syntaxes and the tagged ones
/// (Qwen3-Coder, GLM 4.5) alike.
#[test]
fn every_syntax_streams_arguments_before_its_call_ends() {
    let city = "Saint-Remy-de-Provence";
    let json = format!("{{\"city\": \"{city}\"}}");
    let long = city.len() / 2;
    let cases = [
        (
            ToolSyntax::Hermes,
            format!("<tool_call>{{\"name\": \"get\", \"arguments\": {json}}}</tool_call>"),
            "}</tool_call>",
            long,
        ),
        (
            ToolSyntax::Qwen3Coder,
            format!(
                "<tool_call>\n<function=get>\n<parameter=city>\n{city}\n</parameter>\n</function>\n</tool_call>"
            ),
            "\n</parameter>",
            long,
        ),
        (
            ToolSyntax::Glm45,
            format!(
                "<tool_call>get\n<arg_key>city</arg_key>\n<arg_value>{city}</arg_value>\n</tool_call>"
            ),
            "</arg_value>",
            long,
        ),
        (
            ToolSyntax::Llama3,
            format!("{{\"name\": \"get\", \"parameters\": {json}}}"),
            "\"}}",
            long,
        ),
        (
            ToolSyntax::Mistral,
            format!("[TOOL_CALLS][{{\"name\": \"get\", \"arguments\": {json}}}]"),
            "\"}}]",
            long,
        ),
        (
            ToolSyntax::DeepSeek,
            format!(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{json}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            ),
            "\"}\n```",
            long,
        ),
        (
            ToolSyntax::Harmony,
            format!(
                "<|channel|>commentary to=functions.get <|constrain|>json<|message|>{json}<|call|>"
            ),
            "\"}<|call|>",
            long,
        ),
    ];
    // Every syntax is checked before the verdict, so a failure names all that failed.
    let mut late = Vec::new();
    for (syntax, text, close, least) in cases {
        let reasoning = if syntax == ToolSyntax::Harmony {
            ReasoningFormat::Harmony
        } else {
            ReasoningFormat::Think
        };
        let close_at = text.find(close).unwrap();
        let mut p = OutputParser::new(config(reasoning, Some(syntax)));
        let (mut early, mut args, mut ended) = (0, String::new(), false);
        let mut at = 0;
        for ch in text.chars() {
            for ev in p.push(&ch.to_string(), false) {
                match ev {
                    Event::ToolArgs { delta, .. } => {
                        if at < close_at {
                            early += 1;
                        }
                        args += &delta;
                    }
                    Event::ToolEnd { .. } => ended = true,
                    _ => {}
                }
            }
            at += ch.len_utf8();
        }
        for ev in p.finish().events {
            match ev {
                Event::ToolArgs { delta, .. } => args += &delta,
                Event::ToolEnd { .. } => ended = true,
                _ => {}
            }
        }
        assert!(ended, "{syntax:?}: the call never ended");
        let got: serde_json::Value = serde_json::from_str(&args)
            .unwrap_or_else(|e| panic!("{syntax:?}: arguments {args:?} are no JSON: {e}"));
        assert_eq!(got["city"], city, "{syntax:?}: {args}");
        if early < least {
            late.push((syntax, early));
        }
    }
    assert!(
        late.is_empty(),
        "argument pieces before the close, (syntax, pieces): {late:?}"
    );
}

fn qwen3_coder() -> OutputConfig {
    config(ReasoningFormat::Think, Some(ToolSyntax::Qwen3Coder))
}

fn glm45() -> OutputConfig {
    config(ReasoningFormat::Think, Some(ToolSyntax::Glm45))
}

/// A Qwen3-Coder block as its template writes one (a newline around each value).
fn qwen3_coder_block(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>\n<function={name}>\n");
    for (k, v) in params {
        s += &format!("<parameter={k}>\n{v}\n</parameter>\n");
    }
    s + "</function>\n</tool_call>"
}

/// A GLM 4.5 block as its template writes one.
fn glm45_block(name: &str, params: &[(&str, &str)]) -> String {
    let mut s = format!("<tool_call>{name}\n");
    for (k, v) in params {
        s += &format!("<arg_key>{k}</arg_key>\n<arg_value>{v}</arg_value>\n");
    }
    s + "</tool_call>"
}

/// The arguments sent for `text`, fed one character per token, output not yet ended.
fn args_streamed(config: OutputConfig, text: &str) -> String {
    let mut p = OutputParser::new(config);
    let mut args = String::new();
    for ch in text.chars() {
        for ev in p.push(&ch.to_string(), false) {
            if let Event::ToolArgs { delta, .. } = ev {
                args += &delta;
            }
        }
    }
    args
}

/// A tagged value's JSON type is read from its text, as the plain parse reads it (JSON when
/// the whole value parses as JSON, else a string): the parser holds no schema. `check`
/// feeds each block whole (the plain parse), split in two at every byte and one character
/// per token, and every feeding must give the arguments written out here byte for byte.
#[test]
fn tagged_arguments_are_the_plain_parse_however_the_text_is_split() {
    let params = [
        ("s", "Paris"),
        ("lead", " Paris "),
        ("n", "3"),
        ("f", "-1.5e3"),
        ("b", "true"),
        ("word", "trueish"),
        ("count", "3 apples"),
        ("date", "2024-01-02"),
        ("obj", "{\"a\": [1, 2]}"),
        ("quoted", "\"x\""),
        ("empty", ""),
        ("lines", "a\n\nb"),
        ("tags", "x</param y </parameter> z </arg_value> w"),
    ];
    let want = concat!(
        "{\"s\":\"Paris\",\"lead\":\" Paris \",\"n\":3,\"f\":-1500.0,\"b\":true,",
        "\"word\":\"trueish\",\"count\":\"3 apples\",\"date\":\"2024-01-02\",",
        "\"obj\":{\"a\":[1,2]},\"quoted\":\"x\",\"empty\":\"\",\"lines\":\"a\\n\\nb\",",
        "\"tags\":\"x</param y </parameter> z </arg_value> w\"}"
    );
    for (cfg, text) in [
        (qwen3_coder(), qwen3_coder_block("get", &params)),
        (glm45(), glm45_block("get", &params)),
    ] {
        let (c, f) = check(cfg, &text);
        assert_eq!(c.calls, [call("get", want)], "{:?}", cfg.tools);
        assert!(!f.unfinished_call);
        let (c, _) = check(cfg, &format!("ok {text}\n{text}"));
        assert_eq!(c.calls, [call("get", want), call("get", want)]);
        assert_eq!(c.content, "ok \n");
    }
}

/// What has been sent at chosen points of a call written one character at a time: a key as
/// soon as its tag is whole, a string value's text as it comes, and nothing a later byte
/// could take back (the newline and the partial tag before a possible close are held; a
/// value that may still parse as JSON is held whole).
#[test]
fn tagged_arguments_stream_as_written_and_hold_what_may_end_the_value() {
    for (cfg, text, close) in [
        (
            qwen3_coder(),
            qwen3_coder_block("get", &[("city", "Paris"), ("n", "3 apples"), ("m", "3")]),
            "</parameter>",
        ),
        (
            glm45(),
            glm45_block("get", &[("city", "Paris"), ("n", "3 apples"), ("m", "3")]),
            "</arg_value>",
        ),
    ] {
        let at = |s: &str| text.find(s).unwrap() + s.len();
        let sent = |upto: usize| args_streamed(cfg, &text[..upto]);
        let name = format!("{:?}", cfg.tools);
        let key_end = if cfg == glm45() {
            "city</arg_key>"
        } else {
            "<parameter=city>"
        };
        assert_eq!(sent(at(key_end)), "{\"city\":", "{name}");
        assert_eq!(sent(at("Par")), "{\"city\":\"Par", "{name}");
        // The value's end may be here: its newline and the partial tag stay held.
        let tail = at("Paris") + 1 + close.len() / 2;
        assert_eq!(
            sent(tail),
            "{\"city\":\"Paris",
            "{name}: {:?}",
            &text[..tail]
        );
        // `3` may still be a number; `3 a` can only be a string.
        assert_eq!(sent(at("3")), "{\"city\":\"Paris\",\"n\":", "{name}");
        assert_eq!(sent(at("3 a")), "{\"city\":\"Paris\",\"n\":\"3 a", "{name}");
        // A number comes whole once the next tag says the value ended.
        let m = text.rfind(close).unwrap();
        assert!(sent(m).ends_with(",\"m\":"), "{name}: {}", sent(m));
        let (c, _) = check(cfg, &text);
        assert_eq!(
            c.calls,
            [call(
                "get",
                "{\"city\":\"Paris\",\"n\":\"3 apples\",\"m\":3}"
            )]
        );
    }
}

/// The value every escape case's arguments must decode to: quotes, backslashes (one before
/// `n`, which is no newline), a newline, a non-ASCII letter, an astral-plane character and
/// a control character.
const TRICKY: &str = "say \"hi\" \\ C:\\new\nnext é 😀 \u{1}";

/// Escapes inside arguments, per syntax, plain (fed whole) and streamed (every split, one
/// character per token, through `check`). A JSON syntax's arguments are the model's JSON
/// text as written (here with `\u00e9` for `é`); a tagged syntax writes the raw text and its
/// arguments escape it as JSON. Both must decode to [`TRICKY`].
#[test]
fn escapes_inside_arguments_in_every_syntax() {
    let json = "\"say \\\"hi\\\" \\\\ C:\\\\new\\nnext \\u00e9 😀 \\u0001\"";
    let verbatim = format!("{{\"q\": {json}}}");
    let cases = [
        (
            ToolSyntax::Hermes,
            format!("<tool_call>{{\"name\": \"get\", \"arguments\": {verbatim}}}</tool_call>"),
            verbatim.clone(),
        ),
        (
            ToolSyntax::Llama3,
            format!("{{\"name\": \"get\", \"parameters\": {verbatim}}}"),
            verbatim.clone(),
        ),
        (
            ToolSyntax::Mistral,
            format!("[TOOL_CALLS][{{\"name\": \"get\", \"arguments\": {verbatim}}}]"),
            verbatim.clone(),
        ),
        (
            ToolSyntax::DeepSeek,
            format!(
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get\n```json\n{verbatim}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"
            ),
            verbatim.clone(),
        ),
        (
            ToolSyntax::Qwen3Coder,
            qwen3_coder_block("get", &[("q", TRICKY)]),
            "{\"q\":\"say \\\"hi\\\" \\\\ C:\\\\new\\nnext é 😀 \\u0001\"}".to_string(),
        ),
        (
            ToolSyntax::Glm45,
            glm45_block("get", &[("q", TRICKY)]),
            "{\"q\":\"say \\\"hi\\\" \\\\ C:\\\\new\\nnext é 😀 \\u0001\"}".to_string(),
        ),
    ];
    for (syntax, text, want) in cases {
        let (c, f) = check(config(ReasoningFormat::Think, Some(syntax)), &text);
        assert_eq!(c.calls, [call("get", &want)], "{syntax:?}");
        assert!(!f.unfinished_call, "{syntax:?}");
        let got: serde_json::Value = serde_json::from_str(&c.calls[0].arguments).unwrap();
        assert_eq!(got["q"], TRICKY, "{syntax:?}");
    }
}
