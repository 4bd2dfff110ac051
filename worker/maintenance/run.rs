//! Where the worker starts its housekeeping: every chore, each on a task of its own.

use std::sync::Arc;

use tokio::sync::Notify;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::chore::{every, Housekeeping};
use super::{erased, leases, storage};

/// Starts every chore on `tasks` until `shutdown`. `wake` is rung when expired leases put
/// turns back, so the claim loop takes them at once.
pub fn spawn(
    house: Housekeeping,
    wake: Arc<Notify>,
    tasks: &mut JoinSet<()>,
    shutdown: &CancellationToken,
) {
    tasks.spawn(every(
        leases::Leases { wake },
        house.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(every(leases::Trim, house.clone(), shutdown.clone()));
    tasks.spawn(every(
        erased::Erased::default(),
        house.clone(),
        shutdown.clone(),
    ));
    tasks.spawn(every(storage::Storage::default(), house, shutdown.clone()));
}
