//! `kvmem erase`: an operator carries out a user's request to be forgotten, from the
//! shell, with the same function and snapshot removal as `POST /v1/erase`.

use clap::Args;

use super::error::CommandError;
use crate::config::Settings;
use crate::erase::{self, Subject};
use std::sync::Arc;

use crate::system::{self, Role};

/// Erase a user (with nothing else), one character, or one session: every row in every
/// table, the snapshot files, their quarantined copies and the objects. Writes: it
/// deletes, and records one `erased` event holding no content. Running it again is safe
/// and removes nothing more.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).multiple(true)
    .args(["user", "character", "session"])))]
pub struct EraseArgs {
    /// The user: alone, the whole user; with --session or --character, only that user's
    /// part of it.
    #[arg(long)]
    pub user: Option<String>,
    /// One character (and its sessions, every user's); with --user, that user's part of it.
    #[arg(long, conflicts_with = "session")]
    pub character: Option<i64>,
    /// One session.
    #[arg(long)]
    pub session: Option<String>,
    /// Print the counts as JSON.
    #[arg(long)]
    pub json: bool,
}

impl EraseArgs {
    fn subject(&self) -> Subject {
        match (&self.user, self.character, &self.session) {
            (Some(u), Some(c), _) => Subject::UserCharacter {
                user: u.clone(),
                character: c,
            },
            (None, Some(c), _) => Subject::Character(c),
            (user, None, Some(s)) => Subject::Session {
                session: s.clone(),
                user: user.clone(),
            },
            (Some(u), None, None) => Subject::User(u.clone()),
            (None, None, None) => unreachable!("clap requires one of them"),
        }
    }
}

pub async fn run(args: EraseArgs, settings: Settings) -> Result<(), CommandError> {
    let app = system::build(Arc::new(settings.clone()), Role::Writer { connections: 2 }).await?;
    let pool = app.pool.clone();
    let store = app.snapshots()?;
    let done = erase::erase(&pool, &store, &args.subject()).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&done)?);
        return Ok(());
    }
    println!(
        "erased {} ({}): {} rows, {} snapshot scopes ({} files, {} quarantined, {} objects, {} bytes)",
        done.kind,
        done.subject,
        done.rows(),
        done.scopes,
        done.stores.files,
        done.stores.quarantined,
        done.stores.objects,
        done.stores.bytes
    );
    for (table, n) in done.tables.iter().filter(|(_, n)| **n > 0) {
        println!("  {table:<24} {n}");
    }
    Ok(())
}
