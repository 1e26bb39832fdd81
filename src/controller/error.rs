use crate::phase::IllegalMove;

/// What can go wrong in a reconcile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{action}: {source}")]
    Kube {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error(transparent)]
    IllegalMove(#[from] IllegalMove),
    /// The slot cannot be turned into a lifecycle Job (it predates the admission rule).
    #[error("{0}")]
    Lifecycle(String),
    #[error("serializing {what}: {source}")]
    Serialize { what: &'static str, source: serde_json::Error },
}

impl Error {
    /// A write lost a race with another writer (HTTP 409); the next pass reads fresh state.
    pub fn is_conflict(&self) -> bool {
        matches!(self, Error::Kube { source, .. } if is_stale_write(source))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches what was being done to a kube error.
pub trait KubeContext<T> {
    fn during(self, action: impl FnOnce() -> String) -> Result<T>;
}

impl<T> KubeContext<T> for std::result::Result<T, kube::Error> {
    fn during(self, action: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| Error::Kube { action: action(), source })
    }
}

/// Whether a kube error is a 404.
pub fn is_not_found(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 404)
}

/// Whether a create lost to an object of the same name (409, reason `AlreadyExists`).
pub fn is_already_exists(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 && status.reason == "AlreadyExists")
}

/// Whether a write guarded by a precondition (uid or resourceVersion) lost because the object
/// changed since it was read (409, reason `Conflict`). The API server answers both with 409;
/// only the reason tells a lost create from a stale write.
pub fn is_stale_write(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(status) if status.code == 409 && status.reason == "Conflict")
}
