//! What a turn puts around the KV besides the dialogue: the HUD (the character's
//! self-state, ephemeral), the digest (world-state facts, versioned) and the token counts
//! both are budgeted with.

pub mod digest;
pub mod hud;
pub mod tokens;
