//! The house's power, read from a Network UPS Tools server, and what a pool does about it
//! (docs/operations.md, "When the power goes out"; docs/decisions.md, D42).
//!
//! - [`address`]: `<ups>@<host>[:<port>]`, as NUT's tools write it;
//! - [`nut`]: one reading of a UPS over the NUT network protocol;
//! - [`reading`]: a UPS's variables as the operator understands them;
//! - [`power_status`]: the pool's `status.power`, step by step from the readings;
//! - [`boots`]: whether a pool may boot a machine now (on battery, returning from an outage);
//! - [`shed`]: which machines go off on battery, in which order.
//!
//! The power-source controller (`controller::power_source`) reads and writes; everything else
//! reads `status.power`, so the webhook, the provider and the scaler judge from one fact.

pub mod address;
pub mod boots;
pub mod nut;
pub mod power_status;
pub mod reading;
pub mod shed;
