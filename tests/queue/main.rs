//! Queue mechanics, tenancy, interfaces, crashes and object storage: the echo generator
//! (a labelled fake for queue mechanics) and the tiny random model. One binary, so llama.cpp
//! is linked once for all of them.

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod chaos;
mod characters;
mod conversations;
mod erase;
mod erase_races;
mod identity;
mod interfaces;
mod object_store;
mod pg_restart;
mod pipeline;
mod queue;
mod recall;
mod retries;
mod sql_statements;
mod storage;
mod tenants;
mod upgrades;
