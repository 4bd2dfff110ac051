//! The character's own notes: "remember this about X", the memory lines a reply keeps
//! about the shared story, and the per-user blob of explicit facts. Each is written by a
//! lane job and read by the turn, apart from what extraction finds.

pub mod about;
pub mod blob;
pub mod lore;
pub mod todos;
