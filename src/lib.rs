//! homelab-autoscaler: powers a pool of physical homelab machines on and off on demand.
//!
//! A machine is a slot ([`api::Node`]); a request for a machine is a [`api::NodeClaim`]. A
//! machine is wanted if and only if a live claim exists for its slot. The pure model lives in
//! [`phase`] (the phase table and the slot's derived report) and [`claim`] (budget, deadline and
//! attempts); what a core Node and a Job say is read in [`machine`] and [`job_outcome`], below
//! the controllers, the scaler and the simulator alike; [`manifests`] renders the CRDs from the
//! types.
#![forbid(unsafe_code)]

pub mod api;
pub mod cache;
pub mod claim;
pub mod clock;
pub mod controller;
pub mod field_manager;
mod fixtures;
pub mod gates;
pub mod grpc;
pub mod job_outcome;
pub mod machine;
pub mod manifests;
pub mod node_declaration;
pub mod operator;
pub mod phase;
pub mod pin_cli;
pub mod placement;
pub mod power;
pub mod provider;
pub mod quantity;
pub mod savings;
pub mod scaler;
pub mod schedule;
pub mod simulator;
pub mod slot_locks;
pub mod telemetry;
pub mod tls;
pub mod ups;
pub mod webhook;
