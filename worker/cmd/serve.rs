//! `kvmem serve`: the HTTP API, with a worker in the same process unless told otherwise.
//! An exposed address without a token refuses to start before anything is loaded.

use std::sync::Arc;

use clap::Args;

use super::error::CommandError;
use super::worker::{in_process, server, shutdown_on_signal, GeneratorKind, InProcess};
use crate::config::Settings;
use crate::http;
use crate::system;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: String,
    #[arg(long)]
    no_worker: bool,
    #[arg(long, value_enum, default_value = "llama")]
    generator: GeneratorKind,
}

pub async fn run(args: ServeArgs, settings: Settings) -> Result<(), CommandError> {
    let listen = args.listen;
    // Before anything is loaded: an exposed server without a token must not start.
    let addr = tokio::net::lookup_host(&listen)
        .await
        .map_err(CommandError::io(format!("resolving {listen}")))?
        .next()
        .ok_or_else(|| CommandError::Failed(format!("{listen} resolves to no address")))?;
    http::check_exposure(&addr, &settings)?;
    // Signals first, as for `kvmem worker`: a SIGTERM while waiting for the database is a
    // clean exit.
    let shutdown = shutdown_on_signal();
    let connections = settings.queue.concurrency + 8;
    let Some(app) = server(Arc::new(settings), connections, &shutdown).await? else {
        return Ok(());
    };
    let settings = app.settings.clone();
    let InProcess { worker, placement } =
        in_process(args.no_worker, &app, args.generator, &shutdown).await?;
    let model_sha = match &settings.engine.model_path {
        Some(p) => crate::engine::file_sha256(p).unwrap_or_default(),
        None => String::new(),
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(CommandError::io(format!("binding {listen}")))?;
    tracing::info!(%listen, "kvserver listening");
    let memory = system::memory_service(app.pool.clone(), &settings, true).await?;
    let mut state = app.http(model_sha)?;
    if let Some(p) = placement {
        state = state.with_placement("chat", p);
    }
    if let Some(e) = &memory.embedder {
        state = state.with_placement("embedder", e.placement.clone());
    }
    let state = state.with_memory(Arc::new(memory));
    let server = http::serve(listener, state, shutdown.clone());
    let serving = CommandError::io("serving");
    let Some(mut worker) = worker else {
        return server.await.map_err(serving);
    };
    tokio::pin!(server);
    // The in-process worker ending before shutdown means no turn will ever finish:
    // stop serving and exit non-zero rather than answer 504 forever.
    tokio::select! {
        served = &mut server => {
            served.map_err(serving)?;
            worker.await??;
            Ok(())
        }
        ended = &mut worker => {
            // On a signal the worker may finish first: that is a clean stop.
            let asked = shutdown.is_cancelled();
            shutdown.cancel();
            server.await.map_err(serving)?;
            ended??;
            match asked {
                true => Ok(()),
                false => Err(CommandError::Failed(
                    "the in-process worker stopped while the server was still serving".into(),
                )),
            }
        }
    }
}
