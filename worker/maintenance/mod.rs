//! Everything that keeps a running system tidy, in one room: expired leases requeued,
//! events, reply deltas and finished rows deleted, erased snapshot scopes swept, and the
//! snapshot directory kept under its cap. Each chore runs on its own tick in every worker,
//! counts its runs in `/metrics`, and logs, never raises, what failed: housekeeping never
//! stops a worker. The settings are `[maintenance]`.

mod chore;
mod erased;
mod leases;
mod rows;
mod run;
mod storage;

pub use chore::Housekeeping;
pub use erased::ERASED_SCOPES_KEPT;
pub use rows::{storage_totals, Retained, Retention};
pub use run::spawn;
pub use storage::{sweep_storage, StorageSwept};
