//! The chat request reader, kept apart from HTTP so that `fuzz/` can compile it alone and
//! feed it untrusted bytes: a body and the ids its headers add become what kvmem queues,
//! with every check that needs only the request (roles, content, control characters,
//! lengths, sampling fields, id bounds). It depends on std and serde only; the caller's
//! identity, the database and the error responses ([`RequestError`] becomes each) stay in
//! `http/`.
//!
//! The reader runs in steps ([`read`], then [`ChatBody::character`], [`ChatBody::dialogue`]
//! and [`timeout_ms`]) because the chat route checks the caller and looks up a character
//! between them, and a request wrong in two ways is answered with the same refusal as ever.

pub mod dialogue;
pub mod error;
pub mod fields;

use serde::Deserialize;
use serde_json::Value;

pub use dialogue::Dialogue;
pub use error::RequestError;
pub use fields::{Fields, MAX_PERSONA_CHARS};

/// The longest id a request may give (a session, a key): the queue's B-tree indexes hold
/// far longer, so a longer one is a client's bug, answered 400. The user id's bound
/// (`keys::MAX_USER_BYTES`), which the HTTP layer holds this one to.
pub const MAX_ID_BYTES: usize = 256;

#[derive(Deserialize)]
struct ChatRequest {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<ChatMessage>,
    /// OpenAI's end-user field: kvmem's user id.
    #[serde(default)]
    user: Option<String>,
    #[serde(default)]
    session_id: Option<String>,
    #[serde(default)]
    character_id: Option<i64>,
    /// Server-sent `chat.completion.chunk` events instead of one `chat.completion`.
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
}

#[derive(Deserialize)]
struct StreamOptions {
    /// A last chunk with `usage` (and `"usage": null` on every other chunk).
    #[serde(default)]
    include_usage: bool,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    content: Value,
}

/// A chat request's body, typed, with its ids bounded; its messages are read as a dialogue
/// by [`ChatBody::dialogue`].
pub struct ChatBody {
    pub model: Option<String>,
    /// The body's `user`, unchecked: the caller's identity decides what it may be.
    pub user: Option<String>,
    /// The session the request names (`session_id`, else the `X-Session-Id` header).
    pub session: Option<String>,
    /// The `Idempotency-Key` header.
    pub key: Option<String>,
    pub character_id: Option<i64>,
    pub stream: bool,
    pub include_usage: bool,
    /// The turn's sampling options and the system message.
    pub fields: Fields,
    messages: Vec<ChatMessage>,
}

/// The character a request asks for: by id, or by a model name the caller's characters
/// resolve (in the database, so not here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Character<'a> {
    Id(i64),
    Model(&'a str),
}

/// Reads a body and the ids its headers add (`X-Session-Id`, `Idempotency-Key`).
pub fn read(
    body: &[u8],
    session_header: Option<String>,
    key: Option<String>,
) -> Result<ChatBody, RequestError> {
    let text = std::str::from_utf8(body).map_err(|_| RequestError::NotUtf8)?;
    let json = |e: serde_json::Error| RequestError::Json(e.to_string());
    let req: ChatRequest = serde_json::from_str(text).map_err(json)?;
    // The fields are read from the body as a whole: OpenAI's list is long, and a field
    // kvmem does not know is ignored, while one it cannot honour must be seen to be refused.
    // serde skips an unknown field without the nesting limit or the number range, so a body
    // can type as a request and still not parse as JSON (a 1e999, 200 nested lists): it is
    // refused, or its `n`, tools and sampling fields would go unread.
    let fields = fields::read(&serde_json::from_str(text).map_err(json)?)?;
    let session = req.session_id.or(session_header);
    bounded_id("session_id", session.as_deref())?;
    bounded_id("Idempotency-Key", key.as_deref())?;
    Ok(ChatBody {
        model: req.model,
        user: req.user,
        session,
        key,
        character_id: req.character_id,
        stream: req.stream,
        include_usage: req.stream_options.is_some_and(|o| o.include_usage),
        fields,
        messages: req.messages,
    })
}

impl ChatBody {
    /// `character_id` (or the `X-Character-Id` header) wins; else `model` names one of the
    /// user's characters.
    pub fn character(&self, header: Option<&str>) -> Result<Character<'_>, RequestError> {
        match (self.character_id, header) {
            (Some(c), _) => Ok(Character::Id(c)),
            (None, Some(h)) => h
                .parse()
                .map(Character::Id)
                .map_err(|_| RequestError::CharacterHeader),
            (None, None) => self
                .model
                .as_deref()
                .map(Character::Model)
                .ok_or(RequestError::NoCharacter),
        }
    }

    /// The messages as a dialogue, each within `max_chars` (`http.max_message_chars`), and
    /// not a front-end's background task (`task_marker`, `http.task_marker`).
    pub fn dialogue(&self, max_chars: usize, task_marker: &str) -> Result<Dialogue, RequestError> {
        let pairs = self.messages.iter().map(|m| (m.role.as_str(), &m.content));
        let dialogue = dialogue::read(pairs, max_chars)?;
        background_task(task_marker, &dialogue.last)?;
        Ok(dialogue)
    }
}

/// A front-end's background task (a title, tags, follow-ups for a chat) is not a line of
/// the chat: answering it in character would add a session and a memory per chat.
fn background_task(marker: &str, last: &str) -> Result<(), RequestError> {
    if marker.is_empty() || !last.trim_start().starts_with(marker) {
        return Ok(());
    }
    Err(RequestError::BackgroundTask {
        marker: marker.to_string(),
    })
}

fn bounded_id(what: &'static str, id: Option<&str>) -> Result<(), RequestError> {
    match id {
        Some(id) if id.len() > MAX_ID_BYTES => Err(RequestError::IdTooLong {
            what,
            bytes: id.len(),
            limit: MAX_ID_BYTES,
        }),
        Some(id) if id.chars().any(char::is_control) => Err(RequestError::IdControl { what }),
        _ => Ok(()),
    }
}

/// How long the request waits for its turn: the `X-Timeout-Ms` header, capped at
/// `max_ms` (`http.max_timeout_ms`), or `default_ms` (`http.timeout_ms`) without one.
pub fn timeout_ms(header: Option<&str>, default_ms: u64, max_ms: u64) -> Result<u64, RequestError> {
    match header {
        None => Ok(default_ms),
        Some(v) => Ok(v
            .trim()
            .parse::<u64>()
            .map_err(|_| RequestError::Timeout)?
            .min(max_ms)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HI: &str = r#""messages": [{"role": "user", "content": "hi"}]"#;

    fn body(extra: &str) -> Result<ChatBody, RequestError> {
        read(format!("{{{HI}{extra}}}").as_bytes(), None, None)
    }

    #[test]
    fn a_body_that_types_as_a_request_but_is_not_json_is_refused() {
        // serde skips an unknown field without the JSON parser's checks: had the fields
        // been read from no body, `n` would have passed.
        let deep = format!(", \"x\": {}{}", "[".repeat(200), "]".repeat(200));
        for extra in [
            ", \"n\": 2, \"x\": 1e999".to_string(),
            format!(", \"n\": 2{deep}"),
        ] {
            match body(&extra) {
                Err(RequestError::Json(m)) => assert!(!m.is_empty()),
                Err(e) => panic!("{extra}: {e}"),
                Ok(_) => panic!("{extra}: accepted"),
            }
        }
        assert!(matches!(
            body(", \"n\": 2"),
            Err(RequestError::Unsupported { .. })
        ));
    }

    #[test]
    fn ids_are_bounded_by_the_index() {
        let id = |session: &str, key: &str| {
            read(
                format!("{{{HI}}}").as_bytes(),
                Some(session.into()),
                Some(key.into()),
            )
        };
        assert!(id(&"s".repeat(MAX_ID_BYTES), "k").is_ok());
        let long = "é".repeat(MAX_ID_BYTES / 2 + 1);
        let e = id(&long, "k").err().expect("refused").to_string();
        assert_eq!(e, "session_id is 258 bytes; the limit is 256");
        let e = id("s", "k\u{7}").err().expect("refused").to_string();
        assert_eq!(e, "Idempotency-Key holds a control character");
        // The body's session wins over the header's, and is held to the same bound.
        let r = read(
            format!("{{{HI}, \"session_id\": \"b\"}}").as_bytes(),
            Some("h".into()),
            None,
        );
        assert_eq!(r.ok().and_then(|r| r.session).as_deref(), Some("b"));
    }

    #[test]
    fn the_character_comes_from_the_body_then_the_header_then_the_model() {
        let with = |extra: &str, header: Option<&str>| {
            let req = body(extra).unwrap_or_else(|e| panic!("{e}"));
            req.character(header).map(|c| format!("{c:?}"))
        };
        let both = r#", "character_id": 3, "model": "Ada""#;
        assert_eq!(with(both, Some("4")).as_deref(), Ok("Id(3)"));
        assert_eq!(
            with(r#", "model": "Ada""#, Some("4")).as_deref(),
            Ok("Id(4)")
        );
        assert_eq!(
            with(r#", "model": "Ada""#, None).as_deref(),
            Ok("Model(\"Ada\")")
        );
        assert_eq!(with("", Some("x")), Err(RequestError::CharacterHeader));
        assert_eq!(with("", None), Err(RequestError::NoCharacter));
    }

    #[test]
    fn the_timeout_is_the_header_capped_or_the_default() {
        assert_eq!(timeout_ms(None, 5, 10), Ok(5));
        assert_eq!(timeout_ms(Some(" 7 "), 5, 10), Ok(7));
        assert_eq!(timeout_ms(Some("99"), 5, 10), Ok(10));
        assert_eq!(timeout_ms(Some("-1"), 5, 10), Err(RequestError::Timeout));
    }

    #[test]
    fn a_system_message_is_a_persona_only_within_a_personas_bounds() {
        let system = |text: &str| {
            let messages = serde_json::json!([
                {"role": "system", "content": text}, {"role": "user", "content": "hi"}
            ]);
            let req = read(
                format!("{{\"messages\": {messages}}}").as_bytes(),
                None,
                None,
            );
            let req = req.unwrap_or_else(|e| panic!("{e}"));
            req.fields.persona().map(|p| p.map(str::to_string))
        };
        assert_eq!(
            system("You are Ada.\n\tBrief."),
            Ok(Some("You are Ada.\n\tBrief.".into()))
        );
        assert_eq!(
            system(&"x".repeat(MAX_PERSONA_CHARS)).map(|p| p.is_some()),
            Ok(true)
        );
        let limit = MAX_PERSONA_CHARS;
        for bad in ["x".repeat(limit + 1), "You are \u{1b}[31mAda".into()] {
            let e = system(&bad).expect_err("refused");
            assert_eq!(e, RequestError::Persona { limit });
            assert_eq!(e.param(), Some("messages"));
        }
    }

    #[test]
    fn a_background_task_is_refused_after_the_dialogue_is_read() {
        let req = body("").unwrap_or_else(|e| panic!("{e}"));
        assert!(req.dialogue(10, "### Task:").is_ok());
        assert_eq!(
            req.dialogue(1, "").err(),
            Some(RequestError::MessageTooLong {
                index: 0,
                chars: 2,
                limit: 1
            })
        );
        let e = req.dialogue(10, "h").expect_err("a task");
        assert!(e.to_string().starts_with("a front-end's background task (its message starts with \"h\") is not a chat turn; kvmem refuses it"), "{e}");
    }
}
