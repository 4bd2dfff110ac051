//! The small commands on the queue and the digest: `kvmem migrate`, `kvmem enqueue`,
//! `kvmem digest` and `kvmem status`.

use std::sync::Arc;
use std::time::Duration;

use clap::Args;

use super::error::CommandError;
use super::{migrations, status};
use crate::config::Settings;
use crate::context::tokens::{TokenCount, WordCount};
use crate::system::{self, Role};
use crate::{db, queue};

/// `kvmem migrate [--status]`: the upgrade, or the list of migrations.
pub async fn migrate(settings: &Settings, list: bool) -> Result<(), CommandError> {
    let pool = pool(settings, Role::AsIs { connections: 2 }).await?;
    if list {
        print!("{}", migrations::status(&pool).await?);
        return Ok(());
    }
    let done = db::migrate(&pool).await?;
    if done.newer.is_empty() {
        println!("migrated ({} applied)", done.applied.len());
    } else {
        println!(
            "nothing to do: the schema is newer than this binary ({} additive migration(s) of a \
             newer release); the SQL API and views stay the newer release's",
            done.newer.len()
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct EnqueueArgs {
    #[arg(long)]
    session: String,
    #[arg(long)]
    user: String,
    #[arg(long)]
    character: i64,
    #[arg(long)]
    message: String,
    #[arg(long)]
    idempotency_key: Option<String>,
}

/// `kvmem enqueue`: one turn queued, as a backend would with `kvmem_enqueue_turn`.
pub async fn enqueue(args: EnqueueArgs, settings: &Settings) -> Result<(), CommandError> {
    let pool = pool(settings, Role::Writer { connections: 1 }).await?;
    let id = queue::enqueue(
        &pool,
        &args.session,
        &args.user,
        args.character,
        &args.message,
        args.idempotency_key.as_deref(),
    )
    .await?;
    println!("{id}");
    Ok(())
}

/// `kvmem digest`: a session's digest built from its facts, stored only with `store`.
pub async fn digest(session: &str, store: bool, settings: &Settings) -> Result<(), CommandError> {
    let role = match store {
        true => Role::Writer { connections: 1 },
        false => Role::Reader {
            connections: 1,
            command: "digest",
        },
    };
    let pool = pool(settings, role).await?;
    // The model's tokenizer when a model is configured, else the word counter.
    let tok: std::sync::Arc<dyn TokenCount> = match &settings.engine.model_path {
        Some(_) => system::load_model(settings).await? as std::sync::Arc<dyn TokenCount>,
        None => std::sync::Arc::new(WordCount),
    };
    let max = settings.turn.digest_max_tokens as usize;
    let built = match store {
        true => {
            let metrics = crate::metrics::global();
            crate::context::digest::rebuild(&pool, session, max, tok.as_ref(), &metrics)
                .await?
                .0
        }
        false => crate::context::digest::build_for(&pool, session, max, tok.as_ref()).await?,
    };
    println!("{}\n{}", built.version, built.content);
    Ok(())
}

/// `kvmem status [--watch SECS]`: the queue report and storage, once or every `watch`.
pub async fn watch_status(watch: Option<u64>, settings: &Settings) -> Result<(), CommandError> {
    let reader = Role::Reader {
        connections: 1,
        command: "status",
    };
    let app = system::build(Arc::new(settings.clone()), reader).await?;
    let (pool, store) = (app.pool.clone(), app.snapshots()?);
    loop {
        let mut text = status::report(&pool).await?;
        text.push_str(&status::storage(&pool, &store).await?);
        if watch.is_some() {
            print!("\x1b[2J\x1b[H");
        }
        print!("{text}");
        match watch {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs.max(1))).await,
            None => return Ok(()),
        }
    }
}

/// The pool `role` calls for, through the builder.
async fn pool(settings: &Settings, role: Role<'_>) -> Result<sqlx::PgPool, CommandError> {
    Ok(system::build(Arc::new(settings.clone()), role).await?.pool)
}
