//! Why a chat request is refused, as data: the HTTP layer turns each into the 400 it has
//! always answered (the message is the `Display`, `param` the field a refusal names), and
//! the reader stays free of axum so `fuzz/` compiles it alone.

/// A chat request the reader refuses. Every one is the client's to fix: none is retried.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request body is not valid UTF-8")]
    NotUtf8,
    /// serde_json's own words, which name the line and column.
    #[error("invalid request JSON: {0}")]
    Json(String),
    /// A field kvmem cannot honour as asked (one reply, plain text, no tools).
    #[error("unsupported field `{field}`: {why}")]
    Unsupported {
        field: &'static str,
        why: &'static str,
    },
    /// A sampling field outside what the turn's options admit.
    #[error("invalid `{field}`: {why}")]
    Invalid {
        field: &'static str,
        why: &'static str,
    },
    #[error("{what} is {bytes} bytes; the limit is {limit}")]
    IdTooLong {
        what: &'static str,
        bytes: usize,
        limit: usize,
    },
    #[error("{what} holds a control character")]
    IdControl { what: &'static str },
    #[error("X-Character-Id must be an integer")]
    CharacterHeader,
    #[error("missing character (body `model` or `character_id`, or header X-Character-Id)")]
    NoCharacter,
    #[error("messages[{index}]: role `{role}` is not supported (user, assistant, system)")]
    Role { index: usize, role: String },
    #[error("messages[{index}]: only text content is supported")]
    NotText { index: usize },
    #[error("message content must be a string")]
    NotString,
    #[error(
        "messages[{index}] has {chars} characters; the limit is {limit} (http.max_message_chars)"
    )]
    MessageTooLong {
        index: usize,
        chars: usize,
        limit: usize,
    },
    #[error("messages[{index}] contains a NUL byte (0x00), which text cannot hold")]
    Nul { index: usize },
    #[error("messages[{index}] contains control characters (only tab, CR and LF are allowed)")]
    Control { index: usize },
    #[error("no user message in `messages`")]
    NoUserMessage,
    /// A front-end's title, tags or follow-ups request (`http.task_marker`): the HTTP layer
    /// answers it with its own error type, so the front-end can tell it from bad input.
    #[error(
        "a front-end's background task (its message starts with {marker:?}) is not a chat \
         turn; kvmem refuses it so it adds no session or memory. Point the front-end's \
         task model elsewhere or turn the task off (docs/http-api.md#front-ends)"
    )]
    BackgroundTask { marker: String },
    #[error("X-Timeout-Ms must be a whole number of milliseconds")]
    Timeout,
    /// A system message that would become the character's persona past what an edit of
    /// the persona takes (`characters::check`).
    #[error(
        "invalid `messages`: the system message becomes the character's persona \
         (http.system_message = persona), which is at most {limit} characters, without \
         control characters but tab, CR and LF"
    )]
    Persona { limit: usize },
}

impl RequestError {
    /// The request field the refusal is about, for OpenAI's `param`; only the refusals of
    /// one field have named one, so only they do.
    pub fn param(&self) -> Option<&'static str> {
        match self {
            RequestError::Unsupported { field, .. } | RequestError::Invalid { field, .. } => {
                Some(field)
            }
            RequestError::Persona { .. } => Some("messages"),
            _ => None,
        }
    }
}
