//! The guard a test binds first thing to see the components' logs when it fails.

use crate::control_plane::ControlPlane;
use crate::plane::Plane;

/// Prints the components' log tails when dropped during a panic (a failing assertion).
pub struct FailureLogs<'a> {
    plane: Held<'a>,
}

enum Held<'a> {
    Borrowed(&'a ControlPlane),
    /// A handle of its own, so the guard borrows nothing (an owned plane stays up until the
    /// guard, too, is gone).
    Handle(Plane),
}

impl<'a> FailureLogs<'a> {
    pub(crate) fn borrowing(plane: &'a ControlPlane) -> Self {
        Self { plane: Held::Borrowed(plane) }
    }
}

impl FailureLogs<'static> {
    pub(crate) fn holding(plane: Plane) -> Self {
        Self { plane: Held::Handle(plane) }
    }
}

impl Drop for FailureLogs<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let plane: &ControlPlane = match &self.plane {
                Held::Borrowed(plane) => plane,
                Held::Handle(plane) => plane,
            };
            eprintln!("control plane logs at the failure:{}", plane.log_tails(40));
        }
    }
}
