//! `kvmem character`: an operator sets up characters without SQL, public ones for every
//! user of a front-end, or one user's own.

use clap::{Args, Subcommand};

use crate::characters::{self, CharacterError, Edit};
use crate::config::Settings;
use std::sync::Arc;

use crate::db;
use crate::system::{self, Role};

#[derive(Debug, Args)]
pub struct CharacterArgs {
    #[command(subcommand)]
    pub command: CharacterCommand,
}

#[derive(Debug, Subcommand)]
pub enum CharacterCommand {
    /// Add a character: public (everyone may talk to it, each user with their own memory
    /// of it) or owned by one user. Prints its id. Writes.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long, default_value = "")]
        persona: String,
        /// Anyone may talk to it.
        #[arg(long, conflicts_with = "user")]
        public: bool,
        /// The one user who may talk to it.
        #[arg(long, required_unless_present = "public")]
        user: Option<String>,
    },
    /// List characters: every one, or those a user may talk to. Read-only.
    List {
        /// Only what this user may talk to: the public ones and their own.
        #[arg(long)]
        user: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change a character's name, persona, or whether it is public. A new persona reaches
    /// warm sessions at their next turn. Writes.
    Edit {
        id: i64,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        persona: Option<String>,
        #[arg(long)]
        public: Option<bool>,
    },
    /// Remove a character and every user's data of it (the character erase). Writes.
    Remove { id: i64 },
}

#[derive(Debug, thiserror::Error)]
pub enum CharacterCmdError {
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error(transparent)]
    Db(#[from] db::DbError),
    #[error(transparent)]
    Character(#[from] CharacterError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// Who sets up a public character from the shell: no user of the front-end.
const OPERATOR: &str = "kvmem-operator";

pub async fn run(args: CharacterArgs, settings: Settings) -> Result<(), CharacterCmdError> {
    let app = system::build(Arc::new(settings.clone()), Role::Writer { connections: 2 }).await?;
    let pool = app.pool.clone();
    match args.command {
        CharacterCommand::Add {
            name,
            persona,
            public,
            user,
        } => {
            let owner = user.as_deref().unwrap_or(OPERATOR);
            let c = characters::add(&pool, owner, &name, &persona, public).await?;
            println!("{}", c.id);
        }
        CharacterCommand::List { user, json } => {
            let all = characters::list(&pool, user.as_deref(), user.is_none()).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&all)?);
            } else {
                for c in all {
                    let who = if c.public {
                        "public".into()
                    } else {
                        format!("owned by {}", c.user_id)
                    };
                    println!("{:>6}  {:<24} {}", c.id, c.name, who);
                }
            }
        }
        CharacterCommand::Edit {
            id,
            name,
            persona,
            public,
        } => {
            let change = Edit {
                name,
                persona,
                public,
            };
            let c = characters::edit(&pool, id, None, &change).await?;
            println!("{}", serde_json::to_string(&c)?);
        }
        CharacterCommand::Remove { id } => {
            let store = app.snapshots()?;
            let done = characters::remove(&pool, &store, id, None).await?;
            println!(
                "removed character {id}: {} rows, {} snapshot scopes",
                done.rows(),
                done.scopes
            );
        }
    }
    Ok(())
}
