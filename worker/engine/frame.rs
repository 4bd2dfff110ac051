//! The model's chat template cut into reusable blocks, so every part of a turn (system,
//! user, a past exchange, the reply's close) is tokenized the same way each time.

use llama_cpp_2::model::{LlamaChatMessage, LlamaChatTemplate, LlamaModel};

use super::error::{EngineError, Result};

/// A templated message split around its content: `parts[0] content[0] parts[1] ...`.
#[derive(Debug, Clone)]
pub struct Block {
    pub parts: Vec<String>,
}

/// The model's chat template cut into blocks, found by rendering with sentinels and
/// diffing against a rendered prefix. Works for any template llama.cpp can apply.
#[derive(Debug, Clone)]
pub struct ChatFrame {
    /// A system message (base prompt, HUD, digest).
    pub system: Block,
    /// A user message followed by the assistant's opening.
    pub user: Block,
    /// A whole past exchange, user then assistant, for cold rebuilds.
    pub exchange: Block,
    /// What closes a generated reply (`<|im_end|>\n` for ChatML).
    pub reply_close: String,
}

const SENTINEL: &str = "\u{E000}KVMEM\u{E001}";

impl ChatFrame {
    pub(super) fn new(model: &LlamaModel) -> Result<ChatFrame> {
        let tmpl = model
            .chat_template(None)
            .map_err(|e| EngineError::Template(e.to_string()))?;
        let render = |msgs: &[(&str, &str)], add_ass: bool| -> Result<String> {
            let chat: Vec<LlamaChatMessage> = msgs
                .iter()
                .map(|(r, c)| LlamaChatMessage::new(r.to_string(), c.to_string()))
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| EngineError::Template(e.to_string()))?;
            model
                .apply_chat_template(&tmpl, &chat, add_ass)
                .map_err(|e| EngineError::Template(e.to_string()))
        };
        Self::from_renderer(&tmpl, render)
    }

    fn from_renderer(
        _tmpl: &LlamaChatTemplate,
        render: impl Fn(&[(&str, &str)], bool) -> Result<String>,
    ) -> Result<ChatFrame> {
        let sys = ("system", "x");
        let prefix = render(&[sys], false)?;
        let after = |full: String| -> Result<String> {
            full.strip_prefix(&prefix)
                .map(str::to_string)
                .ok_or_else(|| EngineError::Template("rendering is not prefix-stable".into()))
        };
        let split = |text: String, n: usize| -> Result<Block> {
            let parts: Vec<String> = text.split(SENTINEL).map(str::to_string).collect();
            if parts.len() != n + 1 {
                return Err(EngineError::Template(
                    "content appears a wrong number of times".into(),
                ));
            }
            Ok(Block { parts })
        };
        let system = split(after(render(&[sys, ("system", SENTINEL)], false)?)?, 1)?;
        let user = split(after(render(&[sys, ("user", SENTINEL)], true)?)?, 1)?;
        let exchange = split(
            after(render(
                &[sys, ("user", SENTINEL), ("assistant", SENTINEL)],
                false,
            )?)?,
            2,
        )?;
        let opened = render(&[sys, ("user", "u")], true)?;
        let closed = render(&[sys, ("user", "u"), ("assistant", SENTINEL)], false)?;
        let reply_close = closed
            .strip_prefix(&opened)
            .and_then(|rest| rest.strip_prefix(SENTINEL))
            .ok_or_else(|| {
                EngineError::Template("assistant turn does not follow its opening".into())
            })?
            .to_string();
        Ok(ChatFrame {
            system,
            user,
            exchange,
            reply_close,
        })
    }
}
