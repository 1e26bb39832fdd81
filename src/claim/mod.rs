//! The pure rules of a claim's life: its boot budget and deadline, its attempt number, the
//! bounds that outlive the boot window (`ready_bound`), and what a pin's end hands to the pods
//! whose data its machine holds (`pin_end`). No I/O.

pub mod attempt;
pub mod budget;
pub mod pin_end;
pub mod ready_bound;

pub use attempt::{AttemptSeed, PriorClaim, prior_of_slot, reset_of_slot, seed_attempt};
pub use budget::{BOOT_BUDGET, BudgetConstant, Timeouts, budget_constants, deadline_at};

use std::time::Duration;

/// Failed boots in a row after which a slot is exhausted (and shutdown Jobs after which a
/// scale-down pauses).
pub const MAX_CONSECUTIVE_ATTEMPTS: i32 = 3;
/// After this long without a new failure, a failure streak no longer counts: a fixed startup
/// script is picked up with no hand edit.
pub const ATTEMPT_RESET_GRACE: Duration = Duration::from_secs(30 * 60);
/// The pause of a scale-down whose shutdown Jobs did not power the machine off.
pub const SHUTDOWN_ATTEMPT_RESET_GRACE: Duration = Duration::from_secs(30 * 60);
/// How long a ready claim's machine may be observed off before the claim fails MachineGone:
/// one boot window, so a reboot is not an attempt that ends.
pub const MACHINE_GONE_GRACE: Duration = BOOT_BUDGET;
/// How long a finished claim is kept when it does not say.
pub const DEFAULT_CLAIM_TTL_SECONDS: i32 = 3600;
/// How long a finished lifecycle Job is kept when the slot does not say.
pub const DEFAULT_JOB_TTL_SECONDS: i32 = 600;
/// Pod retries of a lifecycle Job when the slot does not say.
pub const DEFAULT_JOB_BACKOFF_LIMIT: i32 = 2;
/// The finalizer a committed boot carries until its machine is observed off.
pub const FINALIZER: &str = "infra.homecluster.dev/machine-release";
/// `requestedBy` of the built-in scaler's claims.
pub const REQUESTED_BY_SCALER: &str = "homelab-autoscaler/scaler";
