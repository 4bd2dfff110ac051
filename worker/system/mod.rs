//! One place builds a running system from settings: the database pool (migrated, or
//! checked for a command that only reads), the snapshot store, the models, the services,
//! the HTTP state and the worker's dependencies. `kvmem`'s commands, the demo, the tests
//! and the benchmarks all start through [`build`], so they run the same wiring.

mod app;
mod error;
mod pools;
mod services;

pub use app::{build, load_engine, load_model, snapshot_files, snapshot_store, App, Model, Role};
pub use error::SystemError;
pub use pools::{connect_url, pools_opened};
pub use services::{
    memory_lane_service, memory_service, memory_service_loading, memory_service_on,
    summary_lane_service, summary_service, summary_service_on,
};
