//! `kvmem keys`: an operator issues, lists and revokes per-user API keys, the credential
//! `http.identity = "key"` takes a request's user from (docs/http-api.md#identity).

use clap::{Args, Subcommand};

use crate::config::Settings;
use crate::keys::{self, KeyError};
use std::sync::Arc;

use crate::db;
use crate::system::{self, Role};

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[command(subcommand)]
    pub command: KeysCommand,
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key for a user and print it once: only its hash is kept. Writes.
    Create {
        #[arg(long)]
        user: String,
        /// A note to tell the user's keys apart (a device, a front-end).
        #[arg(long, default_value = "")]
        label: String,
    },
    /// List keys (never the keys themselves): id, user, label, prefix, created, revoked.
    /// Read-only.
    List {
        /// Only this user's keys.
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key by the id `list` shows; requests with it get 401 from then on. Writes.
    Revoke { id: i64 },
}

#[derive(Debug, thiserror::Error)]
pub enum KeysCmdError {
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("no key with id {0}")]
    NoSuchKey(i64),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

pub async fn run(args: KeysArgs, settings: Settings) -> Result<(), KeysCmdError> {
    let app = system::build(Arc::new(settings.clone()), Role::Writer { connections: 2 }).await?;
    let pool = app.pool.clone();
    match args.command {
        KeysCommand::Create { user, label } => {
            let (id, key) = keys::create(&pool, &user, &label).await?;
            eprintln!("key {id} for user {user}; it is shown once, store it now:");
            println!("{key}");
        }
        KeysCommand::List { user, json } => {
            let all = keys::list(&pool, user.as_deref()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                for k in all {
                    let state = match k.revoked_at {
                        Some(at) => format!("revoked {}", at.format("%Y-%m-%d %H:%M")),
                        None => "live".into(),
                    };
                    println!(
                        "{:>6}  {:<24} {:<16} {}…  {}  {}",
                        k.id,
                        k.user_id,
                        k.label,
                        k.prefix,
                        k.created_at.format("%Y-%m-%d %H:%M"),
                        state
                    );
                }
            }
        }
        KeysCommand::Revoke { id } => {
            let user = keys::revoke(&pool, id)
                .await?
                .ok_or(KeysCmdError::NoSuchKey(id))?;
            println!("revoked key {id} of user {user}");
        }
    }
    Ok(())
}
