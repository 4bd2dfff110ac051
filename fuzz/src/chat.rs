//! The chat request reader's invariants (`worker/http/request/`): whatever the bytes, it
//! answers (never panics), and what it accepts is within every bound the queue, Postgres
//! and the prompt rely on, checked here against the body itself rather than against the
//! reader's own code.

use serde_json::{Map, Value};

use crate::request::fields::MAX_STOP_CHARS;
use crate::request::{self, Character, ChatBody, Dialogue, RequestError, MAX_ID_BYTES};

/// The settings the reader is run with (`http.*`).
#[derive(Debug, Clone)]
pub struct Rules {
    pub max_message_chars: usize,
    pub task_marker: String,
    pub timeout_ms: u64,
    pub max_timeout_ms: u64,
}

impl Rules {
    /// config/default.toml's.
    pub fn shipped() -> Rules {
        Rules {
            max_message_chars: 32_000,
            task_marker: "### Task:".into(),
            timeout_ms: 120_000,
            max_timeout_ms: 600_000,
        }
    }

    /// Bounds a short input can reach: a message past 16 characters, a one-letter marker.
    pub fn tight() -> Rules {
        Rules {
            max_message_chars: 16,
            task_marker: "t".into(),
            timeout_ms: 0,
            max_timeout_ms: 5,
        }
    }
}

/// The header values the reader takes (`X-Session-Id`, `Idempotency-Key`,
/// `X-Character-Id`, `X-Timeout-Ms`).
#[derive(Debug, Clone, Default)]
pub struct Headers {
    pub session: Option<String>,
    pub key: Option<String>,
    pub character: Option<String>,
    pub timeout_ms: Option<String>,
}

/// Runs every step of the reader, in the chat route's order, on one request, and checks
/// each answer. The caller's identity and the character lookup sit between the steps in
/// the route; they are not the reader's.
pub fn check_chat_request(body: &[u8], headers: &Headers, rules: &Rules) {
    let read = request::read(body, headers.session.clone(), headers.key.clone());
    let again = request::read(body, headers.session.clone(), headers.key.clone());
    assert_eq!(
        read.as_ref().err(),
        again.as_ref().err(),
        "not deterministic"
    );
    let req = match read {
        Ok(req) => req,
        Err(e) => return check_error(&e, body),
    };
    let json: Value = serde_json::from_slice(body).expect("accepted a body that is not JSON");
    let json = as_object(json);
    check_body(&req, &json, headers);
    match req.character(headers.character.as_deref()) {
        Ok(c) => check_character(c, &req, headers),
        Err(e) => check_error(&e, body),
    }
    match req.dialogue(rules.max_message_chars, &rules.task_marker) {
        Ok(d) => check_dialogue(&d, &json, rules),
        Err(e) => check_error(&e, body),
    }
    match request::timeout_ms(
        headers.timeout_ms.as_deref(),
        rules.timeout_ms,
        rules.max_timeout_ms,
    ) {
        Ok(ms) if headers.timeout_ms.is_none() => assert_eq!(ms, rules.timeout_ms),
        Ok(ms) => assert!(ms <= rules.max_timeout_ms, "timeout {ms} past the cap"),
        Err(e) => check_error(&e, body),
    }
    match req.fields.persona() {
        Ok(Some(p)) => {
            assert!(
                p.chars().count() <= request::MAX_PERSONA_CHARS,
                "persona too long"
            );
            assert_text(p, "the persona");
        }
        Ok(None) => assert!(req.fields.system.is_none(), "a system message lost"),
        Err(e) => check_error(&e, body),
    }
}

/// A refusal is a message the client can read, names a field only for a field's refusal,
/// and never comes from a body the reader should have taken for what it is.
fn check_error(e: &RequestError, body: &[u8]) {
    let message = e.to_string();
    assert!(!message.is_empty(), "an empty refusal");
    let named = matches!(
        e,
        RequestError::Unsupported { .. } | RequestError::Invalid { .. }
    ) || matches!(e, RequestError::Persona { .. });
    assert_eq!(e.param().is_some(), named, "param of {e:?}");
    if let Some(p) = e.param() {
        assert!(
            message.contains(&format!("`{p}`")),
            "{message} does not name {p}"
        );
    }
    let utf8 = std::str::from_utf8(body).is_ok();
    assert_eq!(
        matches!(e, RequestError::NotUtf8),
        !utf8,
        "{e:?} on UTF-8 {utf8}"
    );
}

/// The ids are bounded, the body's own fields came through as given, and the sampling
/// options are within what `kvmem_check_turn_options` admits.
fn check_body(req: &ChatBody, json: &Value, headers: &Headers) {
    for (what, id) in [("session", &req.session), ("key", &req.key)] {
        if let Some(id) = id {
            assert!(id.len() <= MAX_ID_BYTES, "{what} of {} bytes", id.len());
            assert!(
                !id.chars().any(char::is_control),
                "{what} {id:?} holds a control char"
            );
        }
    }
    let body = |k: &str| json.get(k).filter(|v| !v.is_null());
    let session = body("session_id")
        .and_then(Value::as_str)
        .map(str::to_string);
    assert_eq!(req.session, session.or(headers.session.clone()), "session");
    assert_eq!(req.key, headers.key, "key");
    assert_eq!(
        req.user.as_deref(),
        body("user").and_then(Value::as_str),
        "user"
    );
    assert_eq!(
        req.model.as_deref(),
        body("model").and_then(Value::as_str),
        "model"
    );
    // The refusals: none of these may be accepted as anything but kvmem's one plain reply.
    let given = |k: &str| body(k).is_some();
    assert!(!given("n") || json["n"] == 1, "n accepted: {}", json["n"]);
    assert!(
        !given("tools") || json["tools"] == Value::Array(vec![]),
        "tools accepted"
    );
    assert!(
        !given("functions") || json["functions"] == Value::Array(vec![]),
        "functions"
    );
    assert!(
        !given("tool_choice") || json["tool_choice"] == "none",
        "tool_choice"
    );
    assert!(
        !given("logprobs") || json["logprobs"] == false,
        "logprobs accepted"
    );
    if given("response_format") {
        assert_eq!(json["response_format"], serde_json::json!({"type": "text"}));
    }
    match &req.fields.options {
        None => {}
        Some(Value::Object(o)) => check_options(o, json),
        Some(other) => panic!("options are not an object: {other}"),
    }
    if let Some(system) = &req.fields.system {
        assert!(!system.trim().is_empty(), "a blank system message");
    }
}

fn check_options(o: &Map<String, Value>, json: &Value) {
    assert!(!o.is_empty(), "empty options instead of none");
    for (k, v) in o {
        match k.as_str() {
            "temperature" => {
                let t = v.as_f64().expect("temperature is a number");
                assert!((0.0..=2.0).contains(&t), "temperature {t}");
                assert_eq!(json[k].as_f64(), Some(t), "temperature changed");
            }
            "top_p" => {
                let p = v.as_f64().expect("top_p is a number");
                assert!(p > 0.0 && p <= 1.0, "top_p {p}");
                assert_eq!(json[k].as_f64(), Some(p), "top_p changed");
            }
            // The worker reads it as a u32: a 7.0 or a -2 must not get here.
            "seed" => {
                let s = v.as_u64().expect("seed is a whole number");
                assert!(s <= u64::from(u32::MAX), "seed {s}");
                assert_eq!(json[k].as_u64(), Some(s), "seed changed");
            }
            "max_tokens" => {
                let m = v.as_u64().expect("max_tokens is a whole number");
                assert!((1..=i32::MAX as u64).contains(&m), "max_tokens {m}");
                let asked = ["max_tokens", "max_completion_tokens"]
                    .iter()
                    .filter_map(|k| json[*k].as_u64())
                    .min();
                assert_eq!(asked, Some(m), "max_tokens is not the smaller asked");
            }
            "stop" => {
                let list = v.as_array().expect("stop is a list");
                assert!(
                    (1..=16).contains(&list.len()),
                    "{} stop strings",
                    list.len()
                );
                for s in list {
                    let s = s.as_str().expect("a stop string is a string");
                    let n = s.chars().count();
                    assert!(n >= 1 && n <= MAX_STOP_CHARS, "a stop string of {n} chars");
                }
            }
            other => panic!("an option the SQL check does not know: {other}"),
        }
    }
}

fn check_character(c: Character<'_>, req: &ChatBody, headers: &Headers) {
    match c {
        Character::Id(id) => {
            let from_header = || headers.character.as_deref().and_then(|h| h.parse().ok());
            assert_eq!(Some(id), req.character_id.or_else(from_header), "character");
        }
        Character::Model(m) => {
            assert!(req.character_id.is_none() && headers.character.is_none());
            assert_eq!(Some(m), req.model.as_deref(), "model");
        }
    }
}

/// Every text the dialogue holds is one a message of the request gave (or their joins),
/// each within the per-message bound and free of control characters but tab, CR and LF.
fn check_dialogue(d: &Dialogue, json: &Value, rules: &Rules) {
    let texts = spoken(json);
    assert!(
        !texts.is_empty(),
        "a dialogue from no user or assistant message"
    );
    let (roles_ok, has_user) = roles(json);
    assert!(
        roles_ok,
        "a role other than user, assistant, system, developer accepted"
    );
    assert!(has_user, "a dialogue without a user message");
    for t in &texts {
        assert!(
            t.chars().count() <= rules.max_message_chars,
            "a message past the limit"
        );
    }
    for (m, r) in &d.history {
        assert_text(m, "a history message");
        assert_text(r, "a history reply");
    }
    assert_text(&d.message, "the message");
    assert_text(&d.last, "the last message");
    assert!(
        d.last.chars().count() <= rules.max_message_chars,
        "last past the limit"
    );
    assert!(
        d.message.ends_with(&d.last),
        "the message does not end with the last"
    );
    assert!(
        texts.contains(&d.last),
        "the last message is not one of the request's"
    );
    if !rules.task_marker.is_empty() {
        assert!(
            !d.last.trim_start().starts_with(&rules.task_marker),
            "a background task"
        );
    }
    // What the history import counts (http.max_history_*) is no more than was sent.
    assert!(
        d.history.len() <= texts.len(),
        "more exchanges than messages"
    );
    let sent: usize = texts.iter().map(|t| t.chars().count() + 2).sum();
    let held: usize = d
        .history
        .iter()
        .map(|(m, r)| m.chars().count() + r.chars().count())
        .sum::<usize>()
        + d.message.chars().count();
    assert!(
        held <= sent,
        "the dialogue holds {held} chars of {sent} sent"
    );
}

/// serde reads a struct from a list too (`[model, messages, user, …]`, fields in their
/// order), and so does the reader: the same body as an object, to compare with.
fn as_object(json: Value) -> Value {
    const REQUEST: [&str; 7] = [
        "model",
        "messages",
        "user",
        "session_id",
        "character_id",
        "stream",
        "stream_options",
    ];
    const MESSAGE: [&str; 2] = ["role", "content"];
    let named = |list: Vec<Value>, names: &[&str]| {
        Value::Object(names.iter().map(|n| n.to_string()).zip(list).collect())
    };
    let mut json = match json {
        Value::Array(list) => named(list, &REQUEST),
        other => other,
    };
    if let Some(Value::Array(messages)) = json.get_mut("messages") {
        for m in messages {
            if let Value::Array(list) = m {
                *m = named(std::mem::take(list), &MESSAGE);
            }
        }
    }
    json
}

/// The (role, content) of every message.
fn messages(json: &Value) -> Vec<(&str, &Value)> {
    let list = json.get("messages").and_then(Value::as_array);
    list.into_iter()
        .flatten()
        .filter_map(|m| Some((m.get("role")?.as_str()?, m.get("content")?)))
        .collect()
}

/// The text of every user and assistant message, as the request gave it.
fn spoken(json: &Value) -> Vec<String> {
    messages(json)
        .into_iter()
        .filter(|(role, _)| matches!(*role, "user" | "assistant"))
        .filter_map(|(_, content)| match content {
            Value::String(s) => Some(s.clone()),
            Value::Null => Some(String::new()),
            Value::Array(parts) => Some(
                parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<String>(),
            ),
            _ => None,
        })
        .collect()
}

/// Whether every role is one the reader takes, and whether one is a user's.
fn roles(json: &Value) -> (bool, bool) {
    let roles: Vec<&str> = messages(json).into_iter().map(|(r, _)| r).collect();
    let known = roles
        .iter()
        .all(|r| matches!(*r, "user" | "assistant" | "system" | "developer"));
    (known, roles.contains(&"user"))
}

/// Text a Postgres `text` column and a prompt can hold as the reader promises: no control
/// character but tab, CR and LF (so no NUL).
fn assert_text(t: &str, what: &str) {
    let bad = t
        .chars()
        .find(|c| c.is_control() && !matches!(c, '\t' | '\r' | '\n'));
    assert!(bad.is_none(), "{what} holds {bad:?}: {t:?}");
}
