//! One reading of a UPS over the NUT network protocol (`LIST VAR <ups>` on upsd's port), with
//! the `rups` client. A reading opens its own connection and closes it: a poll every few
//! seconds costs upsd nothing, and no connection is left half-open across a server restart.

use std::time::Duration;

use super::address::UpsAddress;
use super::reading::UpsReading;

/// An `upsd.users` account.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("username", &self.username).finish_non_exhaustive()
    }
}

/// Why a UPS could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading {address}: {source}")]
    Resolve {
        address: UpsAddress,
        #[source]
        source: crate::power::resolve::ResolveError,
    },
    #[error("{address}: its host has no address")]
    NoAddress { address: UpsAddress },
    #[error("{address} did not answer within {after:?}")]
    Timeout { address: UpsAddress, after: Duration },
    #[error("reading {address}: {source}")]
    Nut {
        address: UpsAddress,
        #[source]
        source: rups::ClientError,
    },
    #[error("{address} lists no ups.status: is {ups} the UPS's name on that server (`upsc -l {host}`)?", ups = .address.ups, host = .address.host)]
    NoStatus { address: UpsAddress },
}

/// Reads the UPS's variables once, within `timeout`.
#[tracing::instrument(skip(credentials), fields(ups = %address))]
pub async fn read(
    address: &UpsAddress,
    credentials: Option<&Credentials>,
    timeout: Duration,
) -> Result<UpsReading, ReadError> {
    match tokio::time::timeout(timeout, read_now(address, credentials)).await {
        Ok(read) => read,
        Err(_) => Err(ReadError::Timeout { address: address.clone(), after: timeout }),
    }
}

async fn read_now(
    address: &UpsAddress,
    credentials: Option<&Credentials>,
) -> Result<UpsReading, ReadError> {
    // Resolved as the power drivers resolve (the image has no glibc resolver), and on tokio:
    // the client's own resolution would block the thread.
    let resolved = crate::power::resolve::Resolver::new()
        .lookup(&address.host, address.port)
        .await
        .map_err(|source| ReadError::Resolve { address: address.clone(), source })?;
    let socket = resolved
        .first()
        .copied()
        .ok_or_else(|| ReadError::NoAddress { address: address.clone() })?;
    let auth = credentials.map(|c| rups::Auth::new(c.username.clone(), Some(c.password.clone())));
    let config =
        rups::ConfigBuilder::new().with_host(rups::Host::from(socket)).with_auth(auth).build();
    let nut = |source| ReadError::Nut { address: address.clone(), source };
    let mut connection = rups::tokio::Connection::new(&config).await.map_err(nut)?;
    let listed = connection.list_vars(&address.ups).await.map_err(nut);
    // LOGOUT is a courtesy to upsd's log; the reading stands without it.
    if let Err(error) = connection.close().await {
        tracing::debug!(%error, "closing the NUT connection");
    }
    let vars = listed?;
    let values: Vec<(String, String)> =
        vars.iter().map(|v| (v.name().to_owned(), v.value())).collect();
    UpsReading::from_vars(values.iter().map(|(n, v)| (n.as_str(), v.as_str())))
        .ok_or_else(|| ReadError::NoStatus { address: address.clone() })
}
