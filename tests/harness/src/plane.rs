//! A handle on a control plane for a fixture that keeps one (the end-to-end World): the test
//! binary's shared plane, or a plane a test owns, which stops when its last handle goes.

use std::ops::Deref;
use std::sync::Arc;

use crate::control_plane::ControlPlane;
use crate::failure_logs::FailureLogs;

/// The shared control plane or an owned one; dereferences to [`ControlPlane`].
#[derive(Clone)]
pub enum Plane {
    /// [`ControlPlane::shared`]: lives until the test process ends.
    Shared(&'static ControlPlane),
    /// [`ControlPlane::start`]: stopped, and its directory removed, when the last handle drops.
    Owned(Arc<ControlPlane>),
}

impl Plane {
    /// [`ControlPlane::logs_on_failure`] with a handle of the guard's own, so that it borrows
    /// nothing from the fixture holding this handle: `let _logs = world.plane.logs_on_failure();`
    /// leaves `world` free to be used mutably.
    pub fn logs_on_failure(&self) -> FailureLogs<'static> {
        FailureLogs::holding(self.clone())
    }
}

impl Deref for Plane {
    type Target = ControlPlane;

    fn deref(&self) -> &ControlPlane {
        match self {
            Plane::Shared(plane) => plane,
            Plane::Owned(plane) => plane,
        }
    }
}

impl From<&'static ControlPlane> for Plane {
    fn from(plane: &'static ControlPlane) -> Self {
        Plane::Shared(plane)
    }
}

impl From<Arc<ControlPlane>> for Plane {
    fn from(plane: Arc<ControlPlane>) -> Self {
        Plane::Owned(plane)
    }
}

impl From<ControlPlane> for Plane {
    fn from(plane: ControlPlane) -> Self {
        Plane::Owned(Arc::new(plane))
    }
}
